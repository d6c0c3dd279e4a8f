"""Console section of `attach`: where each rank is (grouped), its workers, memory and GPU use, and
the Flight Recorder state. Reads ``report.metrics["attach"]`` (torchdoctor/attach/report.py).

Paths and function names come from the target's stacks: untrusted, so made visible.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section

GIB = 1024 ** 3


def _gib(v) -> str:
    return f"{v / GIB:.2f}" if isinstance(v, int) else ""


@section("attach", order=20)
def attach_section(report):
    m = report.metrics.get("attach")
    if not m:
        return None
    head = Text()
    s = m.get("sampler") or {}
    head.append(f"Where each process is ({m.get('stack_samples')} stack samples over "
                f"{m.get('duration_s')} s, {s.get('tool', '?')} {s.get('version', '')}"
                f"{', non-blocking' if not s.get('blocking', True) else ''}):", style="bold")
    for line in m.get("where") or []:
        head.append("\n  " + visible(line))
    for n in m.get("nodes") or []:  # a multi-node attach: node 0's job report
        host = f" ({visible(n['hostname'])})" if n.get("hostname") else ""
        ranks = ", ".join(str(r) for r in n.get("ranks") or [])
        head.append(f"\n  node {n['node_rank']}{host}: " + (f"ranks {ranks}" if n.get("reported")
                                                             else "no report"), style="dim")
    for line in m.get("workers") or []:
        head.append("\n  " + visible(line), style="dim")
    fr = m.get("flight_recorder") or {}
    if fr.get("state") == "not-enabled":
        head.append(f"\n  Flight Recorder: not enabled; {fr.get('how', '')}", style="dim")
    elif fr.get("state") == "read":
        for r, d in sorted((fr.get("ranks") or {}).items()):
            if d.get("error"):
                head.append(f"\n  Flight Recorder rank {r}: {visible(d['error'])}", style="dim")
                continue
            lc, fp = d.get("last_completed") or {}, d.get("first_pending") or {}
            head.append(f"\n  Flight Recorder rank {r}: last completed seq {lc.get('seq')} "
                        f"{visible(lc.get('op', ''))}; first pending "
                        + (f"seq {fp.get('seq')} {visible(fp.get('op', ''))} ({fp.get('state')})"
                           if fp else "none"))
    t = Table(show_edge=False, pad_edge=False, title_justify="left")
    multi = bool(m.get("nodes"))
    for col in ("pid", *(("node",) if multi else ()), "rank", "role", "stacks", "RSS GiB", "GPU util %",
                "GPU mem GiB"):
        t.add_column(col, justify="left" if col in ("role",) else "right")
    for p in m.get("processes") or []:
        util = p.get("gpu_util_mean")
        t.add_row(str(p.get("host_pid") or p.get("pid")), *((str(p.get("node")),) if multi else ()), "" if p.get("rank") is None else str(p["rank"]), p.get("role", ""),
                  f"{p.get('distinct_stacks')}/{p.get('samples')}", _gib(p.get("rss_last")),
                  "" if util is None else f"{util:g}", _gib(p.get("gpu_mem_last")))
    tail = Text("  stacks = distinct main-thread stacks / samples (1/N: the same stack every time)"
                + ("" if m.get("nvml") else f"; GPU: {visible(m.get('nvml_reason') or 'not measured')}"),
                style="dim")
    return Group(head, t, tail)
