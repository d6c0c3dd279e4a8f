"""Running an unmodified training script under measurement.

``launch`` (parent: timeout, process group, output tee, torchrun) spawns ``harness`` (child: arms
instruments, runs the script once with runpy); they talk only through a run directory (``rundir``).
"""
