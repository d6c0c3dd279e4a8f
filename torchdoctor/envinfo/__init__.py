"""The environment a PyTorch bug report needs: collectors, a bounded runner, pure rules.

``collect()`` -> dict of sections (python, os, cpu, memory, torch, torch_cuda, torch_flags,
nvidia, env_vars, packages, warnings, timing_s); a section that failed or hung is
``{"error": "could not collect: ..."}``. ``rules.evaluate(env)`` -> (findings, skipped).
``summary_context()`` -> cheap header facts (no torch import) other commands may reuse.
"""

from torchdoctor.envinfo.collect import collect, report_context, summary_context

__all__ = ["collect", "report_context", "summary_context"]
