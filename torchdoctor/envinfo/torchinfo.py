"""Collectors for torch: build, CUDA runtime view, global flags. Each imports torch itself.

Split in three so that a hang in the CUDA driver (``torch.cuda.is_available`` talks to it)
cannot hide the version facts, which need no driver. Nothing here creates a CUDA context
or allocates device memory. Fields that one torch version lacks are left out and named in
``unavailable`` ({field: reason}), so every torch (2.4 ... 2.13) gives a report.
"""

from __future__ import annotations

from typing import Any, Callable

from torchdoctor.envinfo.runner import describe_exception


def _try(out: dict, unavailable: dict, key: str, fn: Callable[[], Any]) -> None:
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001 - one missing field must not lose the others
        out[key] = None
        unavailable[key] = describe_exception(e)


def cudnn_version_str(v: int | None) -> str | None:
    """cuDNN's integer version as text: 8907 -> 8.9.7 (cuDNN 8), 91002 -> 9.10.2 (cuDNN 9+)."""
    if not v:
        return None
    if v >= 90000:
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"


def build_name(cuda: str | None, hip: str | None) -> str:
    if cuda:
        return f"CUDA {cuda}"
    if hip:
        return f"ROCm {hip}"
    return "CPU"


def torch_build() -> dict:
    """Version and build of the installed torch (no driver calls)."""
    import torch

    out: dict[str, Any] = {"version": torch.__version__}
    unavailable: dict[str, str] = {}
    out["git_version"] = getattr(torch.version, "git_version", None)
    out["debug"] = bool(getattr(torch.version, "debug", False))
    out["cuda"] = getattr(torch.version, "cuda", None)
    out["hip"] = getattr(torch.version, "hip", None)
    out["build"] = build_name(out["cuda"], out["hip"])
    _try(out, unavailable, "cudnn", lambda: cudnn_version_str(torch.backends.cudnn.version()))

    def nccl() -> str | None:
        if not hasattr(torch._C, "_nccl_version"):
            return None  # CPU/ROCm-without-RCCL builds have no NCCL
        return ".".join(str(x) for x in torch.cuda.nccl.version())

    _try(out, unavailable, "nccl", nccl)
    _try(out, unavailable, "mkldnn", lambda: bool(torch.backends.mkldnn.is_available()))
    _try(out, unavailable, "openmp", lambda: bool(torch.backends.openmp.is_available()))
    _try(out, unavailable, "distributed", lambda: bool(torch.distributed.is_available()))
    out["unavailable"] = unavailable
    return out


def torch_cuda() -> dict:
    """What torch sees of the GPUs: available, device count, compiled arch list (driver calls)."""
    import torch

    if not (getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None)):
        return {"available": False, "device_count": 0, "arch_list": [], "reason": "torch is a CPU build"}
    out: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    _try(out, unavailable, "available", lambda: bool(torch.cuda.is_available()))
    _try(out, unavailable, "device_count", lambda: int(torch.cuda.device_count()))
    _try(out, unavailable, "arch_list", lambda: list(torch.cuda.get_arch_list()))
    out["unavailable"] = unavailable
    return out


def matmul_tf32_state(flags: dict) -> bool | None:
    """Whether float32 matmuls may use TF32, from the flags :func:`torch_flags` read; None if unknown.

    torch >= 2.9 has ``backends.cuda.matmul.fp32_precision`` ("tf32" | "ieee" | "none"; "none"
    defers to the legacy flags); older torch only ``allow_tf32`` and
    ``get_float32_matmul_precision()`` ("highest" = no TF32, "high"/"medium" = TF32 allowed).
    """
    new = flags.get("matmul_fp32_precision")
    if new == "tf32":
        return True
    if new == "ieee":
        return False
    legacy = flags.get("matmul_allow_tf32")
    prec = flags.get("float32_matmul_precision")
    if legacy is True or prec in ("high", "medium"):
        return True
    if legacy is False or prec == "highest":
        return False
    return None


def torch_flags() -> dict:
    """Global numerics/performance flags as this process sees them (env vars can change them)."""
    import torch

    b = torch.backends
    out: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    _try(out, unavailable, "matmul_allow_tf32", lambda: bool(b.cuda.matmul.allow_tf32))
    _try(out, unavailable, "matmul_fp32_precision", lambda: str(b.cuda.matmul.fp32_precision))
    _try(out, unavailable, "float32_matmul_precision", torch.get_float32_matmul_precision)
    _try(out, unavailable, "cudnn_allow_tf32", lambda: bool(b.cudnn.allow_tf32))
    _try(out, unavailable, "cudnn_conv_fp32_precision", lambda: str(b.cudnn.conv.fp32_precision))
    _try(out, unavailable, "cudnn_enabled", lambda: bool(b.cudnn.enabled))
    _try(out, unavailable, "cudnn_benchmark", lambda: bool(b.cudnn.benchmark))
    _try(out, unavailable, "cudnn_deterministic", lambda: bool(b.cudnn.deterministic))
    _try(out, unavailable, "deterministic_algorithms", lambda: bool(torch.are_deterministic_algorithms_enabled()))
    _try(out, unavailable, "deterministic_warn_only",
         lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled()))
    _try(out, unavailable, "matmul_fp16_reduced_precision_reduction",
         lambda: bool(b.cuda.matmul.allow_fp16_reduced_precision_reduction))
    _try(out, unavailable, "matmul_bf16_reduced_precision_reduction",
         lambda: bool(b.cuda.matmul.allow_bf16_reduced_precision_reduction))
    _try(out, unavailable, "sdpa_flash", lambda: bool(b.cuda.flash_sdp_enabled()))
    _try(out, unavailable, "sdpa_mem_efficient", lambda: bool(b.cuda.mem_efficient_sdp_enabled()))
    _try(out, unavailable, "sdpa_math", lambda: bool(b.cuda.math_sdp_enabled()))
    _try(out, unavailable, "intra_op_threads", torch.get_num_threads)
    _try(out, unavailable, "inter_op_threads", torch.get_num_interop_threads)
    out["matmul_tf32"] = matmul_tf32_state(out)
    out["unavailable"] = unavailable
    return out
