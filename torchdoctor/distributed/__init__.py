"""Distributed diagnosis for `torchdoctor dist` (no script).

- ``facts``: gather launch variables, backend availability, NCCL version, host facts (impure);
- ``topology``: NVML GPU topology, NVLink/PCIe, and the link capacity it implies;
- ``envaudit``: pure rules over (env vars, facts) -> dist-env-inconsistent, nccl-env-risky,
  nccl-unavailable;
- ``selftest`` / ``selftest_worker``: the collective self-test under torchrun;
- ``busbw``: nccl-tests bandwidth arithmetic; ``rules``: pure judgment of the self-test;
- ``probe``: puts them together into a Report.
"""
