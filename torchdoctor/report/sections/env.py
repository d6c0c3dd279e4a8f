"""Console tables of ``report.metrics["env"]`` (the `env` command): system, torch, GPUs, flags,
environment variables, packages. Each returns None when the report has no env metrics.
A section that could not be collected shows its "could not collect: ..." line instead.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import safe_text
from torchdoctor.report.sections import section

GIB = 1024 ** 3
NA = "n/a"


def _env(report) -> dict | None:
    env = report.metrics.get("env")
    return env if isinstance(env, dict) else None


def _failed(v: Any) -> str | None:
    if isinstance(v, dict) and set(v) == {"error"}:
        return str(v["error"])
    return None


def _gib(b: Any) -> str:
    return f"{b / GIB:.1f} GiB" if isinstance(b, (int, float)) else NA


def _yn(v: Any) -> str:
    return NA if v is None else ("yes" if v else "no")


def _kv(title: str, rows: list[tuple[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=None, show_header=False,
              padding=(0, 2, 0, 0))
    t.add_column(style="dim", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        t.add_row(safe_text(k), v if isinstance(v, Text) else safe_text(NA if v is None else v))
    return t


def _bad(msg: str) -> Text:
    return Text(msg, style="red")


def _sec(env: dict, name: str) -> tuple[dict, str | None]:
    v = env.get(name)
    if not isinstance(v, dict):
        return {}, f"could not collect: {name} missing"
    return v, _failed(v)


@section("env.system", order=10)
def system_section(report):
    env = _env(report)
    if env is None:
        return None
    py, py_err = _sec(env, "python")
    osi, os_err = _sec(env, "os")
    cpu, cpu_err = _sec(env, "cpu")
    mem, mem_err = _sec(env, "memory")
    rows: list[tuple[str, Any]] = []
    if py_err:
        rows.append(("Python", _bad(py_err)))
    else:
        where = " (venv)" if py.get("virtualenv") else (" (conda)" if py.get("conda") else "")
        rows.append(("Python", f"{py.get('version')} {py.get('implementation') or ''}{where}  {py.get('executable')}"))
    if os_err:
        rows.append(("OS", _bad(os_err)))
    else:
        distro = osi.get("distribution") or osi.get("system")
        bits = [distro, f"kernel {osi.get('release')}", osi.get("machine"), osi.get("libc")]
        if osi.get("container"):
            bits.append("container")
        rows.append(("OS", ", ".join(str(b) for b in bits if b)))
    if cpu_err:
        rows.append(("CPU", _bad(cpu_err)))
    else:
        cores = f"{cpu.get('physical_cores')} cores / {cpu.get('logical_cores')} threads"
        avail = cpu.get("available_to_process")
        if avail is not None and avail != cpu.get("logical_cores"):
            cores += f", {avail} usable by this process"
        if cpu.get("cgroup_cpu_limit"):
            cores += f", cgroup limit {cpu['cgroup_cpu_limit']} CPUs"
        load = cpu.get("load_average_1_5_15")
        if load:
            cores += f", load {load[0]}"
        rows.append(("CPU", f"{cpu.get('model') or NA} ({cores})"))
    if mem_err:
        rows.append(("RAM", _bad(mem_err)))
    else:
        ram = f"{_gib(mem.get('available_bytes'))} available of {_gib(mem.get('total_bytes'))}"
        if mem.get("cgroup_limit_bytes"):
            ram += f", cgroup limit {_gib(mem['cgroup_limit_bytes'])}"
        if mem.get("swap_total_bytes"):
            ram += f", swap {_gib(mem.get('swap_used_bytes'))} used of {_gib(mem['swap_total_bytes'])}"
        rows.append(("RAM", ram))
        if mem.get("shm_total_bytes") is not None:
            rows.append(("/dev/shm", f"{_gib(mem.get('shm_free_bytes'))} free of {_gib(mem['shm_total_bytes'])}"))
    return _kv("System", rows)


@section("env.torch", order=11)
def torch_section(report):
    env = _env(report)
    if env is None:
        return None
    t, err = _sec(env, "torch")
    if err:
        return _kv("PyTorch", [("torch", _bad(err))])
    rows: list[tuple[str, Any]] = [
        ("torch", f"{t.get('version')} ({t.get('build')}{', debug' if t.get('debug') else ''})"),
        ("CUDA runtime", t.get("cuda") or ("ROCm " + t["hip"] if t.get("hip") else "none (CPU build)")),
        ("cuDNN", t.get("cudnn") or "none"),
        ("NCCL", t.get("nccl") or "none"),
    ]
    tc, tc_err = _sec(env, "torch_cuda")
    if tc_err:
        rows.append(("CUDA available", _bad(tc_err)))
    elif tc.get("reason"):
        rows.append(("CUDA available", f"no ({tc['reason']})"))
    else:
        ok = tc.get("available")
        txt = f"{_yn(ok)}, {tc.get('device_count')} device(s)"
        rows.append(("CUDA available", Text(txt, style="" if ok else "bold red")))
        if tc.get("arch_list"):
            rows.append(("compiled for", " ".join(tc["arch_list"])))
    extras = [k for k in ("mkldnn", "openmp", "distributed") if t.get(k)]
    if extras:
        rows.append(("built with", ", ".join(extras)))
    return _kv("PyTorch", rows)


def _gpu_rows(g: dict) -> tuple[list[str], list[str]]:
    """Two rows for GPU ``g``: load (``LOAD_COLUMNS``) and links/health (``LINK_COLUMNS``)."""
    mem = g.get("memory") or {}
    util = g.get("utilization") or {}
    pcie = g.get("pcie") or {}
    ecc = g.get("ecc")
    nvl = g.get("nvlink")
    mem_txt = (f"{(mem.get('used_bytes') or 0) / GIB:.1f} / {mem['total_bytes'] / GIB:.1f}"
               if mem.get("total_bytes") else NA)
    power = (f"{g['power_draw_w']:.0f} / {g['power_limit_w']:.0f}"
             if g.get("power_draw_w") is not None and g.get("power_limit_w") is not None else NA)
    pcie_txt = (f"gen{pcie.get('gen')} x{pcie.get('width')} (max gen{pcie.get('max_gen')} x{pcie.get('max_width')})"
                if pcie else NA)
    if isinstance(ecc, dict):
        if ecc.get("enabled"):
            errs = (ecc.get("corrected_volatile"), ecc.get("uncorrected_volatile"))
            ecc_txt = "on, " + " / ".join(NA if e is None else str(e) for e in errs)
        else:
            ecc_txt = "off"
    else:
        ecc_txt = NA
    nvl_txt = f"{nvl['active']} of {nvl['links']} up" if isinstance(nvl, dict) else NA
    idx = str(g.get("index"))
    load = [idx, str(g.get("name") or NA), str(g.get("compute_capability") or NA), mem_txt,
            f"{util['gpu_pct']}%" if "gpu_pct" in util else NA,
            f"{g['temperature_c']}°C" if g.get("temperature_c") is not None else NA, power]
    links = [idx, pcie_txt, ecc_txt, nvl_txt, _yn(g.get("persistence_mode")), _yn(g.get("mig_mode"))]
    return load, links


LOAD_COLUMNS = ("#", "name", "cc", "memory GiB", "util", "temp", "power W")
LINK_COLUMNS = ("#", "PCIe link", "ECC (corr / uncorr)", "NVLink", "persistence", "MIG")


def _table(columns: tuple[str, ...]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
    for c in columns:
        t.add_column(c, no_wrap=c in ("#", "name", "memory GiB", "power W"), overflow="fold")
    return t


def _processes(gpus: list[dict]) -> list[Text]:
    lines = []
    for g in gpus:
        procs = g.get("processes")
        if not isinstance(procs, list) or not procs:
            continue
        for p in procs:
            size = _gib(p.get("used_bytes")) if p.get("used_bytes") is not None else "size n/a"
            me = " (this process)" if p.get("self") else ""
            lines.append(safe_text(f"  GPU {g.get('index')}: pid {p.get('pid')} {p.get('name') or '?'} "
                                   f"{p.get('type')} {size}{me}"))
    return lines


@section("env.gpus", order=12)
def gpu_section(report):
    env = _env(report)
    if env is None:
        return None
    nv, err = _sec(env, "nvidia")
    title = Text("GPUs", style="bold")
    if err:
        return Group(title, _bad(err))
    if not nv.get("present"):
        return Group(title, Text(f"{nv.get('reason') or 'no NVIDIA driver found'}: no NVIDIA GPU can be "
                                 "used on this machine (that is fine for CPU work).", style="dim"))
    head = Text(f"driver {nv.get('driver') or NA} (supports CUDA ≤ {nv.get('cuda_driver') or NA}), "
                f"{nv.get('gpu_count')} GPU(s)")
    gpus = nv.get("gpus") or []
    t, t2 = _table(LOAD_COLUMNS), _table(LINK_COLUMNS)
    fails = []
    for g in gpus:
        err_g = g.get("error")
        if err_g:
            fails.append(_bad(f"GPU {g.get('index')}: {err_g}"))
            continue
        load, links = _gpu_rows(g)
        t.add_row(*load)
        t2.add_row(*links)
    parts: list[Any] = [title, head]
    if len(t.rows):
        parts += [t, Text(""), t2]
    notes = sorted({f"{k}: {v}" for g in gpus if not g.get("error") for k, v in (g.get("unavailable") or {}).items()})
    if notes:
        parts.append(Text("n/a = " + "; ".join(notes), style="dim"))
    parts += fails
    procs = _processes([g for g in gpus if not g.get("error")])
    parts.append(Text("processes holding GPU memory:" if procs else "processes holding GPU memory: none",
                      style="dim"))
    parts += procs
    for g in gpus:
        rr = (g.get("ecc") or {}).get("remapped_rows") if isinstance(g.get("ecc"), dict) else None
        if rr and (rr.get("pending") or rr.get("failure") or rr.get("uncorrectable")):
            parts.append(_bad(f"GPU {g.get('index')}: remapped rows {rr} (a pending remap needs a GPU reset)"))
    return Group(*parts)


@section("env.flags", order=13)
def flags_section(report):
    env = _env(report)
    if env is None:
        return None
    f, err = _sec(env, "torch_flags")
    if err:
        return _kv("torch flags", [("flags", _bad(err))])
    tf32 = f.get("matmul_tf32")
    matmul = (f"{'on' if tf32 else 'off' if tf32 is False else NA} (float32_matmul_precision="
              f"{f.get('float32_matmul_precision')}, matmul.fp32_precision={f.get('matmul_fp32_precision')})")
    rows: list[tuple[str, Any]] = [
        ("TF32 matmul", matmul),
        ("TF32 cuDNN", f"{_yn(f.get('cudnn_allow_tf32'))} (conv.fp32_precision={f.get('cudnn_conv_fp32_precision')})"),
        ("cudnn.benchmark", _yn(f.get("cudnn_benchmark"))),
        ("deterministic", f"algorithms {_yn(f.get('deterministic_algorithms'))}"
                          f"{' (warn only)' if f.get('deterministic_warn_only') else ''}, "
                          f"cudnn.deterministic {_yn(f.get('cudnn_deterministic'))}"),
        ("SDPA backends", ", ".join(k for k, n in (("flash", "sdpa_flash"), ("mem-efficient", "sdpa_mem_efficient"),
                                                   ("math", "sdpa_math")) if f.get(n)) or "none"),
        ("CPU threads", f"intra-op {f.get('intra_op_threads')}, inter-op {f.get('inter_op_threads')}"),
    ]
    return _kv("torch flags (as this process starts; your script may change them)", rows)


@section("env.vars", order=14)
def vars_section(report):
    env = _env(report)
    if env is None:
        return None
    ev, err = _sec(env, "env_vars")
    if err:
        return _kv("Environment variables", [("", _bad(err))])
    if not ev:
        return Group(Text("Environment variables", style="bold"),
                     Text("none of CUDA_*, NCCL_*, TORCH_*, PYTORCH_*, OMP_* ... set", style="dim"))
    return _kv("Environment variables", [(k, _short(v)) for k, v in ev.items()])


def _short(v: str, limit: int = 160) -> str:
    """Long values (NVIDIA_REQUIRE_CUDA is ~3 KB in CUDA images) are cut on the console; JSON keeps all."""
    return v if len(v) <= limit else f"{v[:limit]}… ({len(v)} chars, full value in --json)"


@section("env.packages", order=15)
def packages_section(report):
    env = _env(report)
    if env is None:
        return None
    pk, err = _sec(env, "packages")
    if err:
        return _kv("Packages", [("", _bad(err))])
    related = pk.get("related") or {}
    have = [f"{k} {v}" for k, v in related.items() if v]
    rows: list[tuple[str, Any]] = [("installed", ", ".join(have) or "none")]
    wheels = pk.get("nvidia_wheels") or {}
    if wheels:
        rows.append(("nvidia wheels", ", ".join(f"{k} {v}" for k, v in wheels.items())))
    parts: list[Any] = [_kv("Packages", rows)]
    warns = env.get("warnings") or []
    if warns:
        parts.append(Text("Warnings while collecting:", style="bold yellow"))
        parts += [safe_text(f"  {w.get('category')}: {w.get('message')}", style="yellow") for w in warns]
    return Group(*parts)
