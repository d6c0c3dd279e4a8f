"""Console section of ``treat``: one row per trial, then what to change for each adopted one.

Drawn from ``report.metrics["trials"]`` (and ``metrics["treat"]`` for how the run ended). Every
further metric a run contributes (``before``/``after`` beyond step time and peak memory, e.g.
FLOP/s once measured) gets a line under the table. Paths and code come from the user's script:
rendered as text, never markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import safe_text
from torchdoctor.report.sections import section

STYLE = {"adopt": "bold green", "noise": "dim", "reject": "yellow", "failed": "bold red",
         "skipped": "dim"}
SHOWN = ("step_ms", "peak_memory", "peak_reserved")  # columns of their own


def _mib(b: Any) -> str:
    return f"{b / 2**20:.0f}" if isinstance(b, (int, float)) else "–"


def _ms(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else "–"


def _loss(e: dict[str, Any]) -> str:
    if e.get("loss_ok") is None:
        return "–" if e["verdict"] in ("skipped", "failed") else "not compared"
    d = e.get("loss_max_rel_diff")
    mark = "ok" if e["loss_ok"] else "drift"
    return f"{mark} {d:.1e}" if isinstance(d, (int, float)) else mark


def trials_table(entries: list[dict[str, Any]]) -> Table:
    t = Table(title="Trials (baseline vs treated, medians over rounds)", title_justify="left",
              title_style="bold", show_edge=False, pad_edge=False)
    for col, just in (("trial", "left"), ("verdict", "left"), ("ms/step", "right"),
                      ("speed-up", "right"), ("noise", "right"), ("peak MiB", "right"),
                      ("loss", "left")):
        t.add_column(col, justify=just, no_wrap=col in ("trial", "ms/step", "peak MiB"))
    for e in entries:
        if e["verdict"] == "skipped" and not e.get("rounds", {}).get("treated"):
            continue
        sp = e.get("speedup")
        t.add_row(
            e["name"], Text(e["verdict"], style=STYLE.get(e["verdict"], "")),
            f"{_ms(e.get('baseline_step_ms'))} → {_ms(e.get('treated_step_ms'))}",
            f"{sp:.2f}x" if isinstance(sp, (int, float)) else "–",
            f"±{e['noise_band']:.0%}" if isinstance(e.get("noise_band"), (int, float)) else "–",
            f"{_mib(e.get('peak_memory_before'))} → {_mib(e.get('peak_memory_after'))}",
            _loss(e))
    return t


@section("treat", order=15)
def treat_section(report) -> Group | None:
    entries = report.metrics.get("trials")
    if entries is None or "treat" not in report.metrics:
        return None
    parts: list[Any] = []
    ran = [e for e in entries if e.get("rounds", {}).get("treated") or e["verdict"] != "skipped"]
    if ran:
        parts.append(trials_table(entries))
    else:
        parts.append(Text("No trial ran.", style="bold"))
    for e in ran:
        if e["verdict"] in ("reject", "failed", "noise", "skipped"):
            parts.append(safe_text(f"  {e['name']}: {e['verdict']}: {e.get('reason', '')}",
                                   style=STYLE.get(e["verdict"], "")))
        extra = {k: (e["before"].get(k), e["after"].get(k)) for k in e.get("before", {})
                 if k not in SHOWN and k in e.get("after", {})}
        for k, (b, a) in extra.items():
            parts.append(Text(f"  {e['name']}: {k} {b:.4g} → {a:.4g}", style="dim"))
        if e.get("compile_s") is not None:
            parts.append(Text(f"  {e['name']}: compiling took {e['compile_s']:.3g} s, in steps "
                              f"{e.get('compile_steps')} (left out of the step time)", style="dim"))
        for n in e.get("notes") or []:
            parts.append(safe_text(f"  {e['name']}: {n}", style="dim"))
        if e.get("loss_note") and e["verdict"] not in ("skipped", "failed"):
            parts.append(safe_text(f"  {e['name']}: {e['loss_note']}", style="dim"))
    skipped = [e for e in entries if e["verdict"] == "skipped" and e not in ran]
    if skipped:
        parts.append(safe_text("Not tried: " + "; ".join(f"{e['name']} ({e['reason']})" for e in skipped),
                               style="dim"))
    adopted = [e for e in entries if e["verdict"] == "adopt" and e.get("fix")]
    for e in adopted:
        head = Text(f"Adopt {e['name']}", style="bold green")
        sp = e.get("speedup")
        if isinstance(sp, (int, float)):
            head.append(f" ({sp:.2f}x)", style="green")
        parts.append(head)
        parts.append(safe_text(e["fix"], keep_newlines=True))
    meta = report.metrics["treat"]
    stop = meta.get("stopped")
    if stop == "budget":
        parts.append(Text(f"--budget ({meta.get('budget_s'):g} s) reached: the trials not run are "
                          "listed as skipped.", style="bold yellow"))
    elif stop == "interrupted":
        parts.append(Text("Interrupted: the table shows what ran before Ctrl-C.", style="bold yellow"))
    parts.append(Text(f"{meta.get('runs')} runs in {meta.get('wall_s'):.1f} s "
                      f"({meta.get('rounds')} rounds each)", style="dim"))
    return Group(*parts)
