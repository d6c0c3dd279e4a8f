"""The save audit: the script's own ``torch.save`` calls against the live training objects, and the
simulated restart of ``repro --resume-check``."""
