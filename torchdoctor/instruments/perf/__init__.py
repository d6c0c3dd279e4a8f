"""Step-time contributors outside the profiler: CPU contention, module moves, the DataLoader that fed the
steps, and the FLOP count of one step (the yardstick's numerator)."""
