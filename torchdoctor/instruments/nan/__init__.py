"""Non-finite values: the monitor that finds the first NaN/Inf of a run (its window queue and rows in
``_nan_window``/``_nan_rows``), and the follow-up re-run that names the op."""
