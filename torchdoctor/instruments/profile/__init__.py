"""The profiler window (probe ``profile``): torch.profiler over a few steps, its plan and budget, the
analysis of the window as plain data (``_profile_*``: no torch) and the one reader of the profiler's
private API (``_profiler_compat``)."""
