"""Console section of a multi-node job: the nodes table (node 0's job report), or where the job
report is (every other node's own section).

Reads ``report.metrics["nodes"]`` / ``["node"]`` (torchdoctor/distributed/jobreport.py). Host
names, GPU models and errors came from other machines: rendered through ``safe.py``.
"""

from __future__ import annotations

from rich.table import Table

from torchdoctor.safe import safe_text, visible
from torchdoctor.report.sections import section


@section("nodes", order=24)
def nodes(report):
    rows = report.metrics.get("nodes")
    if rows:
        t = Table(title=f"Nodes ({len(rows)}): the job report, gathered by node 0",
                  title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
        for col in ("node", "host", "ranks", "GPU", "step ms", "outcome"):
            t.add_column(col, justify="right" if col == "step ms" else "left")
        for n in rows:
            if not n.get("reported"):
                t.add_row(str(n.get("node_rank")), "", "", "", "", "no report")
                continue
            ms = n.get("median_step_ms")
            t.add_row(str(n.get("node_rank")), safe_text(n.get("hostname") or ""),
                      ", ".join(map(str, n.get("ranks") or [])), safe_text(n.get("gpu") or "cpu"),
                      f"{ms:.3g}" if isinstance(ms, (int, float)) else "", safe_text(n.get("outcome") or ""))
        return t
    me = report.metrics.get("node")
    if not me:
        return _selftest_nodes(report)
    where = visible(me.get("job_report") or "node 0")
    line = (f"This is node {me.get('node_rank')} of {me.get('nnodes')} "
            f"(host {visible(me.get('hostname') or '?')}, ranks {', '.join(map(str, me.get('ranks') or [])) or 'none'}): "
            f"its own ranks only. The job report (every node, cross-rank and cross-node findings) is "
            f"{where}; ")
    line += ("this node's summary was sent there." if me.get("sent")
             else f"this node's summary could not be sent ({visible(me.get('send_error') or '?')}).")
    return safe_text(line, style="cyan")


def _selftest_nodes(report):
    """The self-test across nodes: bus bandwidth inside vs between nodes, NCCL's transport."""
    st = (report.metrics.get("dist") or {}).get("selftest") or {}
    nb = st.get("nodes")
    if not st.get("nnodes") or not isinstance(nb, dict):
        return None
    from torchdoctor.distributed.selftest_nodes import transport_words

    size = nb.get("bytes")
    bits = [f"Across {st.get('nnodes')} nodes (this is node {st.get('node_rank')}), all-reduce of "
            f"{size} bytes:"]
    for key, label in (("intra", "inside a node"), ("inter", "between nodes")):
        v = nb.get(f"{key}_busbw_gbs")
        if isinstance(v, (int, float)):
            bits.append(f"{label} {v:.3g} GB/s bus bandwidth;")
    words = transport_words(st.get("transport") or {})
    bits.append(f"NCCL transport: {words}." if words else "NCCL transport: not reported (gloo, or NCCL_DEBUG set).")
    return safe_text(" ".join(bits), style="cyan")
