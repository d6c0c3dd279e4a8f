"""Console sections of `torchdoctor dist`: environment/topology, and the collective self-test.

Both read ``report.metrics["dist"]`` (see torchdoctor/distributed/probe.py) and return None without it.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import safe_text
from torchdoctor.report.sections import section


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def _gpu_line(g: dict) -> str:
    pcie = g.get("pcie") or {}
    bits = [f"GPU{g['index']} {g['name']}", f"PCIe gen{pcie.get('max_gen')} x{pcie.get('max_width')}"]
    if g.get("nvlink_links"):
        speed = f" × {g['nvlink_speed_mbps'] / 1000:g} GB/s" if g.get("nvlink_speed_mbps") else ""
        bits.append(f"NVLink {g['nvlink_links']} links{speed} → {', '.join(g.get('nvlink_remote') or [])}")
    return "  ".join(bits)


@section("dist-environment", order=30)
def dist_environment(report):
    d = report.metrics.get("dist")
    if not d:
        return None
    t = Table(title="Distributed environment", title_justify="left", show_header=False, box=None,
              pad_edge=False, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    backends = d.get("backends") or {}
    t.add_row("backends", ", ".join(f"{k} {'✓' if v else '✗'}" for k, v in backends.items()) or "none")
    t.add_row("NCCL", safe_text(d.get("nccl_version") or "—"))
    launch = d.get("launch") or {}
    t.add_row("launch", safe_text(" ".join(f"{k}={v}" for k, v in launch.items())
                                  or "not launched (no RANK/WORLD_SIZE)"))
    variables = d.get("variables") or {}
    if variables:
        t.add_row("variables", safe_text(" ".join(f"{k}={v}" for k, v in variables.items())))
    topo = d.get("topology") or {}
    if topo.get("available"):
        for g in topo.get("gpus", []):
            t.add_row("gpu", _gpu_line(g))
        for p in topo.get("pairs", [])[:28]:
            t.add_row("pair", f"GPU{p['a']}–GPU{p['b']}: {p.get('level_name') or '?'}, "
                              f"P2P {p.get('p2p_read') or '?'}, NVLink P2P {p.get('p2p_nvlink') or '?'}")
    else:
        t.add_row("topology", safe_text(topo.get("reason") or "unknown"))
    cap = d.get("link_capacity")
    if cap and (cap.get("gbs") or (d.get("selftest") or {}).get("backend") == "nccl"):
        t.add_row("links allow", f"{cap['gbs']:g} GB/s per direction ({cap['basis']})" if cap.get("gbs")
                  else f"unknown ({cap.get('reason')})")
    return t


@section("dist-selftest", order=31)
def dist_selftest(report):
    st = (report.metrics.get("dist") or {}).get("selftest")
    if not st:
        return None
    head = Text()
    head.append("Collective self-test", style="bold")
    head.append(f"  {st.get('backend')} · {st.get('world_size')} ranks · {st.get('status')} · "
                f"{st.get('wall_s', 0):.1f} s", style="dim")
    checks = Text()
    for c in st.get("checks", []):
        ok = c.get("ok")
        checks.append(("✓ " if ok else "✗ ") + c["op"], style="green" if ok else "bold red")
        if not ok and c.get("max_abs_err"):
            checks.append(f" (max err {c['max_abs_err']:g})", style="red")
        checks.append("   ")
    parts = [head, checks]
    sweep = st.get("sweep") or []
    if sweep:
        cap = ((report.metrics.get("dist") or {}).get("link_capacity") or {}).get("gbs")
        t = Table(title_justify="left", show_edge=False, box=None, padding=(0, 2))
        t.add_column("all-reduce", justify="right")
        t.add_column("time", justify="right")
        t.add_column("algbw GB/s", justify="right")
        t.add_column("busbw GB/s", justify="right")
        if cap:
            t.add_column("of links", justify="right")
        for r in sweep:
            row = [_size(r["bytes"]), f"{r['time_us']:,.0f} µs", f"{r['algbw_gbs']:.2f}", f"{r['busbw_gbs']:.2f}"]
            if cap:
                row.append(f"{r['busbw_gbs'] / cap:.0%}")
            t.add_row(*row)
        parts.append(t)
    return Group(*parts)
