"""Collectors for the host: Python, OS, CPU, RAM, environment variables, package versions.

Each function returns a JSON-able dict or raises; the runner turns a raise or a hang into
"could not collect". Nothing here imports torch, and no package is imported to learn its
version (importlib.metadata reads the installed metadata only). Sizes are in bytes.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

# Packages whose versions a PyTorch bug report needs; looked up by distribution name.
RELATED_PACKAGES = (
    "torch", "numpy", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm", "transformers",
    "accelerate", "deepspeed", "lightning", "pytorch-lightning", "torchmetrics", "timm", "peft",
    "xformers", "flash-attn", "bitsandbytes", "apex", "torchao", "torchdata", "safetensors",
    "tensorboard", "onnx", "onnxruntime", "nvidia-ml-py", "psutil", "typer", "rich",
)

ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCHELASTIC_",
                "TRITON_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "NVIDIA_", "OMP_", "MKL_", "KMP_", "GLOO_",
                "HIP_", "ROCR_", "UCX_", "FI_")
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "VIRTUAL_ENV", "CONDA_PREFIX",
             "CONDA_DEFAULT_ENV")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|AUTH", re.I)
REDACTED = "<redacted>"


def python_info() -> dict:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "virtualenv": sys.prefix != sys.base_prefix,
        "conda": bool(os.environ.get("CONDA_PREFIX")),
    }


def _os_release() -> str | None:
    for p in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            for line in Path(p).read_text().splitlines():
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
        except OSError:
            continue
    return None


def os_info() -> dict:
    libc, libc_ver = platform.libc_ver()
    return {
        "system": platform.system(),
        "release": platform.release(),
        "distribution": _os_release(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "libc": f"{libc} {libc_ver}".strip() or None,
        "container": any(Path(p).exists() for p in ("/.dockerenv", "/run/.containerenv")),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model name")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _cgroup_cpu_quota() -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` (or v1 cfs quota); None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else round(int(quota) / int(period), 2)
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if q <= 0 else round(q / p, 2)
    except (OSError, ValueError):
        return None


def cpu_info() -> dict:
    import psutil

    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {
        "model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "available_to_process": affinity,
        "cgroup_cpu_limit": _cgroup_cpu_quota(),
        "load_average_1_5_15": load,
    }


def _cgroup_memory_limit() -> int | None:
    """Bytes allowed by a cgroup (v2 ``memory.max`` or v1); None when unlimited or unknown."""
    for p in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(p).read_text().strip()
        except OSError:
            continue
        if raw == "max":
            return None
        try:
            v = int(raw)
        except ValueError:
            continue
        return None if v >= 1 << 60 else v
    return None


def memory_info() -> dict:
    import psutil

    vm = psutil.virtual_memory()
    sw = psutil.swap_memory()
    out = {
        "total_bytes": int(vm.total),
        "available_bytes": int(vm.available),
        "swap_total_bytes": int(sw.total),
        "swap_used_bytes": int(sw.used),
        "cgroup_limit_bytes": _cgroup_memory_limit(),
        "shm_total_bytes": None,
        "shm_free_bytes": None,
    }
    try:  # DataLoader workers pass batches through /dev/shm; containers often give it 64 MiB
        st = os.statvfs("/dev/shm")
        out["shm_total_bytes"] = st.f_frsize * st.f_blocks
        out["shm_free_bytes"] = st.f_frsize * st.f_bavail
    except OSError:
        pass
    return out


def wanted_env_var(name: str) -> bool:
    return name.startswith(ENV_PREFIXES) or name in ENV_NAMES


def env_vars(environ: dict[str, str] | None = None) -> dict:
    """Variables that change what torch, CUDA, NCCL or the launcher do; secrets redacted."""
    env = os.environ if environ is None else environ
    return {k: (REDACTED if _SECRET.search(k) else v) for k, v in sorted(env.items()) if wanted_env_var(k)}


def _nvidia_wheels() -> dict[str, str]:
    """``nvidia-*`` wheels (cuDNN, NCCL, cuBLAS, ... shipped with torch), read from dist-info names."""
    out: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if n.startswith("nvidia_") and n.endswith(".dist-info") and "-" in n:
                dist, ver = n[: -len(".dist-info")].split("-", 1)
                if dist == "nvidia_ml_py":  # the NVML bindings, listed with the related packages
                    continue
                out.setdefault(dist.replace("_", "-"), ver)
    return dict(sorted(out.items()))


def packages() -> dict:
    """{"related": {name: version or None}, "nvidia_wheels": {name: version}} without importing any."""
    from importlib import metadata

    related: dict[str, str | None] = {}
    for name in RELATED_PACKAGES:
        try:
            related[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            related[name] = None
    return {"related": related, "nvidia_wheels": _nvidia_wheels()}
