"""Console section of a ranked run's collectives (``report.metrics["collectives"]``, from
torchdoctor/evidence/commranks.py): per rank and kind, ms per recorded step, exposed vs
overlapped, bytes and bus bandwidth. None without it."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.memory.units import human_bytes
from torchdoctor.report.sections import section


def _ms(v) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else ""


@section("collectives", order=26)
def collectives_section(report) -> Group | None:
    m = report.metrics.get("collectives")
    if not m or not m.get("per_rank"):
        return None
    t = Table(title=f"Collectives per rank ({m.get('basis')}): ms per recorded step",
              title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    for col in ("rank", "collective", "calls", "ms", "exposed", "overlapped", "bytes", "busbw GB/s",
                "of step"):
        t.add_column(col, justify="left" if col in ("rank", "collective") else "right")
    for row in m["per_rank"]:
        kinds = row.get("kinds") or {}
        for kind, k in kinds.items():
            b = k.get("bytes_per_step")
            t.add_row(str(row["rank"]), kind, _ms(k.get("calls_per_step")), _ms(k.get("ms")),
                      _ms(k.get("exposed_ms")), _ms(k.get("overlapped_ms")),
                      human_bytes(b) if isinstance(b, (int, float)) else "", _ms(k.get("busbw_gbs")), "")
        tot = row.get("total") or {}
        share = tot.get("exposed_share")
        t.add_row(str(row["rank"]), "all (union)", "", _ms(tot.get("ms")), _ms(tot.get("exposed_ms")),
                  _ms(tot.get("overlapped_ms")), "", "",
                  f"{share:.0%} exposed" if isinstance(share, (int, float)) else "", style="bold")
    foot = Text(f"  {m.get('note', '')}", style="dim")
    of = next(((r["rank"], r.get("step_ms") if (r.get("total") or {}).get("share_of") == "un-profiled step"
                else r.get("profiled_step_ms"), (r.get("total") or {}).get("share_of"))
               for r in m["per_rank"] if (r.get("total") or {}).get("share_of")), None)
    if of and of[1]:
        foot.append(f"; exposed share of the {of[2]} ({_ms(of[1])} ms on rank {of[0]})", style="dim")
    return Group(t, foot)
