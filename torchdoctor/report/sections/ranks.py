"""Console section of a ranked run (``--nproc-per-node``): per-rank step times and arrival lags.

Reads ``report.metrics["ranks"]`` (torchdoctor/distributed/stragglers.py ``rank_summary``); None without it.
"""

from __future__ import annotations

from rich.table import Table

from torchdoctor.report.sections import section

PHASES = (("data", "data"), ("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt"),
          ("other", "other"))


def _ms(v) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else ""


@section("ranks", order=25)
def per_rank(report) -> Table | None:
    m = report.metrics.get("ranks")
    if not m or not m.get("per_rank"):
        return None
    t = Table(title=f"Per rank ({m['world_size']} ranks): median ms per step after warm-up; lag = "
                    f"arrival at backward vs the other ranks",
              title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    for col in ("rank", "steps", "step", *(label for _, label in PHASES), "lag", "last"):
        t.add_column(col, justify="left" if col == "rank" else "right")
    for row in m["per_rank"]:
        ph = row.get("phase_ms") or {}
        last = row.get("last_share")
        t.add_row(str(row["rank"]), str(row.get("steps", "")), _ms(row.get("median_step_ms")),
                  *(_ms(ph.get(p)) for p, _ in PHASES), _ms(row.get("median_lag_ms")),
                  f"{last:.0%}" if isinstance(last, (int, float)) else "")
    return t
