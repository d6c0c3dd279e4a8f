"""Probes: what each script command arms (instruments) and judges (rules).

A probe is named by its command (``checkup``, ``profile``, ``memory``, ``nan``); instruments
and rules opt in by listing the probe name in their ``probes`` (``"run"``: every script probe).
``run_probe`` (:mod:`torchdoctor.probes.run`) launches the script with the probe's
instruments, loads the Evidence, runs the rules and returns the Report. Families add report
metrics with ``@metrics_provider(name)`` (:mod:`torchdoctor.probes.registry`) and follow-up
runs with ``@followup(code)`` (:mod:`torchdoctor.probes.followups`), in modules of this
package (discovered automatically).
"""

from torchdoctor.probes.registry import metrics_provider  # noqa: F401  (re-export)
