"""``torch.compile``: dynamo's counters at the end of every checkup, and the diagnostics of
``torchdoctor compile`` (graph breaks, recompiles, compile time per step)."""
