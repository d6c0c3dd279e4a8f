"""Distributed diagnosis for `torchdoctor dist` (no script).

- ``facts``: gather launch variables, backend availability, NCCL version, host facts (impure);
- ``topology``: NVML GPU topology, NVLink/PCIe, and the link capacity it implies;
- ``selftest`` / ``selftest_worker``: the collective self-test under torchrun;
- ``busbw``: nccl-tests bandwidth arithmetic;
- ``evidence``: what the rules judge (probes ``dist-env`` and ``dist-selftest``: the rules
  live in torchdoctor/rules/dist_env.py, dist_nccl_env.py and dist_selftest.py);
- ``probe``: puts them together into a Report.
"""
