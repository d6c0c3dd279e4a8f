"""`torchdoctor attach`: diagnose a running job without restarting it (docs/attach.md).

``procs`` finds the processes (PIDs, or a torchrun job's ranks), ``sampler`` reads their Python
stacks with py-spy, ``resources`` samples RSS and NVML, ``flight`` reads the NCCL Flight Recorder
through the rank's pipe, ``session`` collects all of it into the evidence dict within the bounds,
``views`` (pure) says where each process is; ``report`` builds the Report the rules of probe
``attach`` (``torchdoctor/rules/attach.py``) judge.
"""
