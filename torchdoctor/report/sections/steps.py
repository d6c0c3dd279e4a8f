"""Console section: where the step time went (from ``report.metrics['steps']``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from torchdoctor.report.sections import section

BAR = 30
LABELS = {"data": "data wait", "forward": "forward", "backward": "backward",
          "optimizer": "optimizer", "other": "other"}


def _bar(share: float) -> Text:
    n = max(0, min(BAR, round(share * BAR)))
    return Text("█" * n + "·" * (BAR - n), style="cyan" if share < 0.3 else "yellow")


# steps torchdoctor's own measurement slowed, left out of the figures (evidence/steps.py)
OWN_STEPS = (("profiler_window_steps_skipped", "the profiler window"),
             ("site_window_steps_skipped", "the allocation-site window"),
             ("flop_count_step_skipped", "the FLOP counter"))


@section("steps", order=20)
def step_breakdown(report) -> Table | None:
    m = report.metrics.get("steps")
    if not m or not m.get("judged"):
        return None
    warm = f", first {m['warmup_skipped']} left out as warm-up" if m.get("warmup_skipped") else ""
    own = [f"{len(v)} slowed by {what}" for key, what in OWN_STEPS if (v := m.get(key))]
    if own:
        warm += " and " + ", ".join(own) if warm else ", left out: " + ", ".join(own)
    t = Table(title=f"Step time: {m['judged']} steps{warm}; mean {m['mean_step_ms']:.3g} ms/step "
                    f"(median {m['median_step_ms']:.3g}, p90 {m['p90_step_ms']:.3g})",
              title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    dev = m.get("device") or {}
    dshare = dev.get("share") or {}
    by_device = m.get("share_basis") == "device"
    hshare = m.get("host_share") or m["share"]
    t.add_column("phase")
    t.add_column("host ms/step" if dev else "mean ms/step", justify="right")
    t.add_column("host share" if dev else "share", justify="right")
    if dev:
        t.add_column("GPU ms", justify="right")
        if dshare:
            t.add_column("GPU share", justify="right")
    t.add_column("")
    unseen = bool(m.get("forward_unseen"))
    for p, label in LABELS.items():
        if unseen and p == "forward":
            t.add_row(label, "not seen", *([""] * (len(t.columns) - 2)))
            continue
        hs = float(hshare.get(p, 0.0))
        row = [label, f"{m['mean_ms'].get(p, 0.0):.3g}", f"{hs:.0%}"]
        if dev:
            v = dev.get(f"{p}_ms")
            row.append(f"{v:.3g}" if v is not None else "")
            if dshare:
                row.append(f"{float(dshare.get(p, 0.0)):.0%}")
        row.append(_bar(float(m["share"].get(p, 0.0))))
        t.add_row(*row)
    notes = []
    if unseen:
        notes.append("forward not seen (torch.compile runs the model without module hooks): its "
                     "time is in other")
    if m.get("phase_overlap_ms"):
        notes.append(f"phases nest ({m['phase_overlap_ms']:.3g} ms/step counted twice, e.g. forward "
                     "inside a closure optimizer's step): shares are of the phase total")
    if dev and dev.get("busy_share") is not None:
        notes.append(f"GPU busy {dev['busy_share']:.0%} of the step (CUDA events): bars by "
                     + ("GPU time, the GPU is the bottleneck" if by_device else
                        "host time, the host is the bottleneck"))
    elif dev and dev.get("busy") is not None:
        notes.append(f"GPU busy ≤ {dev['busy']:.0%} of the step (CUDA events, median)")
    if (m.get("step_time_basis") and m.get("step_time_basis") != "host wall"
            and float(m.get("host_mean_step_ms") or 0) < 0.95 * float(m["mean_step_ms"])):
        notes.append(f"step time from the GPU's step-end events (the host's own wall: "
                     f"{m.get('host_mean_step_ms', 0):.3g} ms, it runs ahead of the GPU)")
    if notes:
        t.caption = "; ".join(notes)
        t.caption_justify = "left"
    return t
