"""Gather the whole environment (``collect``) or a cheap header (``summary_context``).

``collect`` runs every collector at once under the runner: the wall time is that of the
slowest collector (importing torch, ≈ 1.5 s on the CPU box), and no probe can take longer
than its timeout. Warnings emitted while collecting (torch's CUDA-init warnings, a missing
numpy, ...) are recorded as facts instead of being printed.
"""

from __future__ import annotations

import ast
import os
import platform
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from torchdoctor.envinfo import nvml, system, torchinfo
from torchdoctor.envinfo.runner import Collector, is_failed, run_collectors

# Seconds. torch's import can take tens of seconds on a cold network file system: the bound
# is generous there; the driver and host probes answer in milliseconds when healthy.
TORCH_TIMEOUT_S = 60.0
NVIDIA_TIMEOUT_S = 8.0  # init + count, then each GPU bounded by nvml.GPU_TIMEOUT_S in parallel
HOST_TIMEOUT_S = 5.0


def collectors() -> list[Collector]:
    return [
        Collector("python", system.python_info, HOST_TIMEOUT_S),
        Collector("os", system.os_info, HOST_TIMEOUT_S),
        Collector("cpu", system.cpu_info, HOST_TIMEOUT_S),
        Collector("memory", system.memory_info, HOST_TIMEOUT_S),
        Collector("torch", torchinfo.torch_build, TORCH_TIMEOUT_S),
        Collector("torch_cuda", torchinfo.torch_cuda, TORCH_TIMEOUT_S),
        Collector("torch_flags", torchinfo.torch_flags, TORCH_TIMEOUT_S),
        Collector("nvidia", nvml.nvidia, NVIDIA_TIMEOUT_S),
        Collector("env_vars", system.env_vars, HOST_TIMEOUT_S),
        Collector("packages", system.packages, HOST_TIMEOUT_S),
    ]


def collect(extra: list[Collector] | None = None, scale: float = 1.0) -> dict[str, Any]:
    """Every env fact as one JSON-able dict: {section: dict or {"error": "could not collect: ..."}}.

    Also ``warnings`` (list of {category, message}) and ``timing_s`` ({section: wall seconds}).
    """
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env, timings = run_collectors(collectors() + list(extra or []), scale=scale)
    seen = set()
    env["warnings"] = []
    for w in caught:
        key = (w.category.__name__, str(w.message))
        if key not in seen:
            seen.add(key)
            env["warnings"].append({"category": key[0], "message": key[1].strip()})
    timings["total"] = round(time.monotonic() - t0, 3)
    env["timing_s"] = timings
    return env


def report_context(env: dict[str, Any]) -> dict[str, Any]:
    """Header facts (device, torch, python) from a collected env."""
    ctx: dict[str, Any] = {}
    py = env.get("python")
    if isinstance(py, dict) and not is_failed(py):
        ctx["python"] = py.get("version")
    t = env.get("torch")
    if isinstance(t, dict) and not is_failed(t):
        ctx["torch"] = f"{t.get('version')} ({t.get('build')})"
    gpus = [g for g in gpu_list(env) if not is_failed(g)]
    tc = env.get("torch_cuda")
    cuda_ok = isinstance(tc, dict) and tc.get("available") is True
    names = sorted({g.get("name") or "?" for g in gpus})
    if cuda_ok and gpus:
        ctx["device"] = f"cuda ({len(gpus)}× {', '.join(names)})" if len(gpus) > 1 else f"cuda ({names[0]})"
    elif gpus:
        ctx["device"] = f"cpu (torch cannot use the {len(gpus)} GPU{'s' if len(gpus) > 1 else ''} present)"
    else:
        ctx["device"] = "cpu"
    return ctx


def gpu_list(env: dict[str, Any]) -> list[dict]:
    nv = env.get("nvidia")
    if not isinstance(nv, dict) or not nv.get("present"):
        return []
    return list(nv.get("gpus") or [])


_VERSION_LINE = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+)$", re.M)


def _torch_build_without_import() -> tuple[str | None, str | None]:
    """(torch version, build) read from the installed files, without importing torch."""
    mod = sys.modules.get("torch")
    if mod is not None and hasattr(mod, "version"):
        v = mod.version
        return mod.__version__, torchinfo.build_name(getattr(v, "cuda", None), getattr(v, "hip", None))
    from importlib import metadata, util

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None, None
    build = None
    try:
        spec = util.find_spec("torch")  # finds the package, does not execute it
        if spec and spec.origin:
            text = (Path(spec.origin).parent / "version.py").read_text()
            vals = {}
            for name, raw in _VERSION_LINE.findall(text):
                try:
                    vals[name] = ast.literal_eval(raw.strip())
                except (ValueError, SyntaxError):
                    vals[name] = None
            build = torchinfo.build_name(vals.get("cuda"), vals.get("hip"))
    except (OSError, ImportError, ValueError):
        pass
    return version, build


def summary_context(gpu_timeout_s: float = 2.0) -> dict[str, Any]:
    """Cheap header facts for any command: python, torch (+build), device, gpu name.

    Does not import torch (reads its installed version files); asks NVML for the GPU names,
    bounded by ``gpu_timeout_s``. Typically ≈ 10-60 ms. Keys: python, torch, device, and
    gpu / gpu_count when NVIDIA GPUs are present.
    """
    ctx: dict[str, Any] = {"python": platform.python_version()}
    version, build = _torch_build_without_import()
    ctx["torch"] = f"{version} ({build})" if version and build else (version or "not installed")

    def names() -> list[str]:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return []
        n = pynvml.nvmlDeviceGetCount()
        out = []
        for i in range(n):
            raw = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(raw.decode() if isinstance(raw, bytes) else str(raw))
        return out

    res, _ = run_collectors([Collector("gpus", names, gpu_timeout_s)])
    gpus = res["gpus"] if isinstance(res["gpus"], list) else []
    if gpus:
        ctx["gpu"] = gpus[0] if len(set(gpus)) == 1 else ", ".join(sorted(set(gpus)))
        ctx["gpu_count"] = len(gpus)
    gpu_build = bool(build) and build != "CPU"
    ctx["device"] = f"cuda ({ctx['gpu']})" if gpus and gpu_build else "cpu"
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        ctx["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return ctx
