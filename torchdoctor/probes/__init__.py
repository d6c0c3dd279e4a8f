"""Probes: what each script command arms (instruments) and judges (rules).

A probe is named by its command (``checkup``, ``profile``, ``memory``, ``nan``); instruments
and rules opt in by listing the probe name in their ``probes``. ``run_probe`` (built by the
runner) launches the script with the probe's instruments, loads the Evidence, runs the rules
and returns the Report.
"""
