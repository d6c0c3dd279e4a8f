"""Env rules (probe ``env``): pure functions of the facts ``envinfo.collect()`` gathered.

The evidence is that dict of sections (``torch``, ``torch_flags``, ``nvidia``, ``env_vars`` ...;
a section that failed is ``{"error": "could not collect: ..."}``). No I/O, no torch: every rule
is tested on synthetic dicts and on the saved H100 fixtures. A rule whose section is missing or
failed, or that does not apply, raises :class:`NotApplicable` with the reason; it never guesses.
Thresholds (stated on each code's docs page, "How it is measured"):

- ``gpu-memory-in-use``: memory held by processes other than this one ≥ ``GPU_IN_USE_FRACTION``
  of a GPU's total, on a GPU this process may use (CUDA_VISIBLE_DEVICES honoured).
- ``tf32-disabled``: a CUDA torch, a GPU of compute capability ≥ ``TF32_MIN_CC_MAJOR``.0 (Ampere:
  the first with TF32 tensor cores) and float32 matmul TF32 off in this environment.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.envinfo.runner import is_failed
from torchdoctor.envinfo.torchinfo import matmul_tf32_state
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import MIXED_PRECISION, PERFORMANCE, TENSOR_MEMORY

GPU_IN_USE_FRACTION = 0.10  # share of a GPU's memory held by other processes
TF32_MIN_CC_MAJOR = 8  # compute capability 8.0 (Ampere) and later have TF32 tensor cores
GIB = 1024 ** 3

TORCH_CPU_BUILD_ON_GPU_HOST = declare(
    "torch-cpu-build-on-gpu-host", PERFORMANCE, "error",
    "NVIDIA GPUs are present but the installed torch has no CUDA")
GPU_MEMORY_IN_USE = declare(
    "gpu-memory-in-use", TENSOR_MEMORY, "warning",
    "other processes already hold a large share of a GPU's memory",
    thresholds={"GPU_IN_USE_FRACTION": GPU_IN_USE_FRACTION})
TF32_DISABLED = declare(
    "tf32-disabled", MIXED_PRECISION, "info",
    "float32 matmuls run without TF32 on a GPU that supports it",
    thresholds={"TF32_MIN_CC_MAJOR": TF32_MIN_CC_MAJOR})


def _section(env: dict, name: str, what: str) -> dict:
    v = env.get(name)
    if not isinstance(v, dict):
        raise NotApplicable(f"{what} not collected")
    if is_failed(v):
        raise NotApplicable(f"{what} {v['error']}")
    return v


def _nvidia(env: dict) -> dict:
    return _section(env, "nvidia", "GPU facts")


def _gpus(env: dict) -> list[dict]:
    """The GPUs NVML read successfully; NotApplicable when no NVIDIA driver / no GPU."""
    nv = _nvidia(env)
    if not nv.get("present"):
        raise NotApplicable(nv.get("reason") or "no NVIDIA driver found")
    gpus = [g for g in nv.get("gpus") or [] if not is_failed(g)]
    if not gpus:
        raise NotApplicable("no GPU could be read" if nv.get("gpus") else "no NVIDIA GPU found")
    return gpus


def visible_gpus(gpus: list[dict], cuda_visible_devices: str | None) -> list[dict]:
    """The GPUs a CUDA process started with ``CUDA_VISIBLE_DEVICES`` may use (NVML order assumed).

    Entries are indices or UUID prefixes ("GPU-1a2b..."); an entry that matches nothing ends
    the list (CUDA ignores what follows an invalid entry). Unset -> all GPUs.
    """
    if cuda_visible_devices is None:
        return gpus
    out: list[dict] = []
    for raw in cuda_visible_devices.split(","):
        item = raw.strip()
        if not item:
            break
        match = None
        if item.lstrip("-").isdigit():
            match = next((g for g in gpus if g.get("index") == int(item)), None)
        else:
            match = next((g for g in gpus if str(g.get("uuid") or "").startswith(item)), None)
        if match is None:
            break
        if match not in out:
            out.append(match)
    return out


def _cc(g: dict) -> tuple[int, int] | None:
    try:
        major, minor = str(g.get("compute_capability")).split(".")
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return None


@rule("torch-cpu-build-on-gpu-host", probes={"env"}, needs={"torch", "nvidia"},
      raises=[TORCH_CPU_BUILD_ON_GPU_HOST])
def torch_cpu_build_on_gpu_host(env: dict) -> list[Finding]:
    t = _section(env, "torch", "torch build")
    nv = _nvidia(env)
    if not nv.get("present"):
        return []  # no NVIDIA driver: nothing torch could use; a CPU build is right here
    count = int(nv.get("gpu_count") or len(nv.get("gpus") or []))
    if count == 0 or t.get("cuda") or t.get("hip"):
        return []
    names = sorted({g.get("name") or "?" for g in nv.get("gpus") or [] if not is_failed(g)})
    cuda_drv = nv.get("cuda_driver")
    where = f"a CUDA wheel for CUDA ≤ {cuda_drv} (what driver {nv.get('driver')} supports)" if cuda_drv \
        else "a CUDA wheel"
    return [finding(
        "torch-cpu-build-on-gpu-host",
        f"{count} NVIDIA GPU{'s' if count > 1 else ''} present ({', '.join(names)}) but torch "
        f"{t.get('version')} is a CPU-only build: everything runs on the CPU",
        evidence={"torch": t.get("version"), "torch_cuda": None, "gpus": names, "gpu_count": count,
                  "driver": nv.get("driver"), "driver_cuda": cuda_drv},
        fix=f"Reinstall torch as {where} from https://pytorch.org/get-started/locally/ "
            "(e.g. pip install torch --index-url https://download.pytorch.org/whl/cuXYZ), in this same "
            "environment; then check with `torchdoctor env`.",
    )]


def _proc_text(p: dict) -> str:
    size = f"{p['used_bytes'] / GIB:.2f} GiB" if p.get("used_bytes") is not None else "size unknown"
    return f"pid {p.get('pid')} {p.get('name') or '?'} ({size})"


@rule("gpu-memory-in-use", probes={"env"}, needs={"nvidia", "env_vars"}, raises=[GPU_MEMORY_IN_USE])
def gpu_memory_in_use(env: dict) -> list[Finding]:
    gpus = _gpus(env)
    ev = env.get("env_vars") if isinstance(env.get("env_vars"), dict) else {}
    cvd = ev.get("CUDA_VISIBLE_DEVICES")
    judged = visible_gpus(gpus, cvd)
    if not judged:
        raise NotApplicable(f"CUDA_VISIBLE_DEVICES={cvd!r} selects none of the GPUs NVML lists")
    busy = []
    for g in judged:
        mem = g.get("memory")
        if not isinstance(mem, dict) or not mem.get("total_bytes"):
            continue
        total = int(mem["total_bytes"])
        procs = g.get("processes") if isinstance(g.get("processes"), list) else None
        own = sum(p.get("used_bytes") or 0 for p in procs or [] if p.get("self"))
        listed = sum(p.get("used_bytes") or 0 for p in procs or [] if not p.get("self"))
        # Device "used" also counts processes NVML lists without sizes or cannot show (other
        # containers); driver-reserved memory is not in it where NVML reports it apart (v2).
        device_other = max(0, int(mem.get("used_bytes") or 0) - own)
        held = max(listed, device_other)
        if held / total >= GPU_IN_USE_FRACTION:
            busy.append({
                "gpu": g.get("index"), "name": g.get("name"),
                "held_by_others_gib": round(held / GIB, 2), "total_gib": round(total / GIB, 2),
                "fraction": round(held / total, 3),
                "processes": [_proc_text(p) for p in procs or [] if not p.get("self")]
                or "none visible from here (another container?)",
            })
    if not busy:
        return []
    what = "; ".join(f"GPU {b['gpu']} {b['held_by_others_gib']:.1f} of {b['total_gib']:.1f} GiB "
                     f"({b['fraction']:.0%})" for b in busy)
    evidence: dict[str, Any] = {"gpus": busy, "threshold": f"{GPU_IN_USE_FRACTION:.0%} of a GPU's memory"}
    if cvd is not None:
        evidence["CUDA_VISIBLE_DEVICES"] = cvd
    return [finding(
        "gpu-memory-in-use",
        f"other processes already hold GPU memory: {what}",
        evidence=evidence,
        fix="Stop the processes listed (`nvidia-smi` shows them; a finished job's zombie or a notebook "
            "kernel is the usual holder), or run on a free GPU with CUDA_VISIBLE_DEVICES; size the batch "
            "to the memory that is actually free.",
    )]


@rule("tf32-disabled", probes={"env"}, needs={"torch", "nvidia", "env_vars", "torch_flags"},
      raises=[TF32_DISABLED])
def tf32_disabled(env: dict) -> list[Finding]:
    t = _section(env, "torch", "torch build")
    if not t.get("cuda"):
        raise NotApplicable("torch has no CUDA (TF32 is a CUDA tensor-core mode)")
    gpus = _gpus(env)
    ev = env.get("env_vars") if isinstance(env.get("env_vars"), dict) else {}
    capable = [g for g in visible_gpus(gpus, ev.get("CUDA_VISIBLE_DEVICES"))
               if (_cc(g) or (0, 0))[0] >= TF32_MIN_CC_MAJOR]
    if not capable:
        raise NotApplicable(f"no GPU with TF32 tensor cores (compute capability ≥ {TF32_MIN_CC_MAJOR}.0)")
    flags = _section(env, "torch_flags", "torch flags")
    state = matmul_tf32_state(flags)
    if state is None:
        raise NotApplicable("the matmul TF32 flags could not be read")
    if state:
        return []
    names = sorted({f"{g.get('name')} (sm {g.get('compute_capability')})" for g in capable})
    evidence = {"gpus": names,
                "float32_matmul_precision": flags.get("float32_matmul_precision"),
                "matmul.allow_tf32": flags.get("matmul_allow_tf32"),
                "matmul.fp32_precision": flags.get("matmul_fp32_precision"),
                "cudnn.allow_tf32": flags.get("cudnn_allow_tf32")}
    return [finding(
        "tf32-disabled",
        f"float32 matmuls run in full FP32 (no TF32) on {', '.join(names)}: the default here, "
        "unless your script turns TF32 on",
        evidence={k: v for k, v in evidence.items() if v is not None},
        fix="If the model tolerates TF32's 10-bit mantissa (most training does), call "
            "torch.set_float32_matmul_precision('high') once at start-up; or train in bf16 with "
            "torch.autocast(device_type='cuda', dtype=torch.bfloat16), which is faster still.",
    )]

