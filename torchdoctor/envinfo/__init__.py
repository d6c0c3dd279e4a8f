"""The environment a PyTorch bug report needs: collectors and a bounded runner (measurement only).

``collect()`` -> dict of sections (python, os, cpu, memory, torch, torch_cuda, torch_flags,
nvidia, env_vars, packages, warnings, timing_s); a section that failed or hung is
``{"error": "could not collect: ..."}``. The rules of probe ``env`` (torchdoctor/rules/env.py)
judge that dict: ``judge("env", env, report)``.
``summary_context()`` -> cheap header facts (no torch import) other commands may reuse.
"""

from torchdoctor.envinfo.collect import collect, report_context, summary_context

__all__ = ["collect", "report_context", "summary_context"]
