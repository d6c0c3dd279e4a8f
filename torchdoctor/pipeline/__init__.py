"""The orchestration layer: every command's report is built here, from one typed RunOptions.

Commands (``torchdoctor/commands/``) parse their options, call one entry of this package and
render: ``run.py`` (``run_probe``/``run_ranked``: the script probes, on one process, N ranks or
N nodes), ``checkpoint.py`` (``checkpoint-audit``), ``dist.py`` (``dist``: self-test or script),
``env.py`` (``env``). A script run's options are one :class:`~torchdoctor.pipeline.options.RunOptions`
(``options.py``, the run defaults once), named as on the command line down to the child's
``ctx.options``.

Probes: what each script command arms (instruments) and judges (rules).

A probe is named by its command (``checkup``, ``profile``, ``memory``, ``nan``); rules opt in
by listing the probe name in their ``probes`` (``"run"``: every script probe) and declare the
evidence they ``need``; the instruments a probe arms are derived from those needs
(:func:`torchdoctor.pipeline.registry.probe_needs`).
``run_probe`` (:mod:`torchdoctor.pipeline.run`) launches the script with the probe's
instruments, loads the Evidence, runs the rules and returns the Report. Families add report
metrics with ``@metrics_provider(name, needs=...)`` (:mod:`torchdoctor.pipeline.registry`) and
follow-up runs with ``@followup(code)`` (:mod:`torchdoctor.pipeline.followups`), in modules of this
package (discovered automatically). This package imports nothing (the registry discovers its
modules by name; a re-export here made the registry and the package import each other).
"""
