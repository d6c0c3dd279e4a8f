"""The plots and tables that fit a report's metrics, one function per metrics section.

Each ``section_*(metrics) -> str`` returns "" when its section is absent or has nothing to
draw; :data:`SECTIONS` lists them in page order with the metrics key each one shows (shown
keys are left out of the raw "other measurements" block). Untrusted strings are escaped
(``esc``); numbers are formatted here.
"""

from __future__ import annotations

from typing import Any, Callable

from torchdoctor.report.html.svg import bar_chart, esc, line_chart, share_bar

PHASES = ("data", "forward", "backward", "optimizer", "other")


def _table(head: list[str], rows: list[list[Any]], num_from: int = 1) -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = []
    for r in rows:
        cells = []
        for i, v in enumerate(r):
            text = f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
            cls = ' class="num"' if i >= num_from and isinstance(v, (int, float)) else ""
            cells.append(f"<td{cls}>{esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def section_steps(m: dict[str, Any]) -> str:
    s = m.get("steps")
    if not isinstance(s, dict):
        return ""
    out = ["<h2>Step time</h2>", "<p>" + esc(
        f"median {s.get('median_step_ms')} ms · mean {s.get('mean_step_ms')} ms · p90 "
        f"{s.get('p90_step_ms')} ms over {s.get('judged')} judged steps "
        f"({s.get('warmup_skipped', 0)} warm-up left out)"
        + (f" · step time: {s['step_time_basis']}" if s.get("step_time_basis") else "")) + "</p>"]
    share = s.get("share") or {}
    basis = {"device": " — by GPU time (the GPU is the bottleneck)",
             "host": " — by host time (the host is the bottleneck)"}.get(str(s.get("share_basis")), "")
    out.append(share_bar([(p, share.get(p, 0)) for p in PHASES],
                         title="Where a step's time goes (mean over judged steps)" + basis))
    series = s.get("series")
    if isinstance(series, dict) and series.get("step"):
        st = series["step"]
        curves = [("step time (ms)", st, series.get("wall_ms") or [])]
        if any(series.get("data_ms") or []):
            curves.append(("data wait (ms)", st, series["data_ms"]))
        out.append(line_chart(curves, title="Step time and data wait per step", y_label="ms"))
    return "".join(out)


def section_memory(m: dict[str, Any]) -> str:
    mem = m.get("memory")
    if not isinstance(mem, dict):
        return ""
    out = ["<h2>Memory</h2>"]
    tl = mem.get("timeline") or {}
    steps = tl.get("step") or []
    mib = 2.0 ** 20
    curves = [(label, steps, [v / mib if isinstance(v, (int, float)) else None for v in tl.get(key) or []])
              for key, label in (("heap", "host heap"), ("rss", "host RSS"))
              if tl.get(key)]
    for dev, series in (tl.get("cuda") or {}).items() if isinstance(tl.get("cuda"), dict) else []:
        for key in ("allocated", "reserved"):
            if isinstance(series, dict) and series.get(key):
                curves.append((f"cuda:{dev} {key}", steps, [v / mib for v in series[key]]))
    if steps and curves:
        out.append(line_chart(curves, title="Memory per step", y_label="MiB", from_zero=False))
    rows = []
    for name, tr in (mem.get("trend") or {}).items():
        if isinstance(tr, dict):
            g = tr.get("growth") or {}
            rows.append([tr.get("label", name), tr.get("bytes_per_step"), tr.get("r2"),
                         g.get("severity"), g.get("steps_until_full")])
    if rows:
        out.append("<h3>Growth fit</h3>" + _table(
            ["series", "bytes / step", "fit r²", "severity", "steps until full"], rows))
    sites = (mem.get("sites") or {}) if isinstance(mem.get("sites"), dict) else {}
    grow = [[g.get("site"), g.get("function"), g.get("nodes_per_step")]
            for g in sites.get("graph_growth") or [] if isinstance(g, dict)]
    grow += [[t.get("site"), t.get("function"), t.get("bytes_per_step")]
             for t in sites.get("tensor_sites") or [] if isinstance(t, dict)]
    if grow:
        out.append("<h3>Growing sites</h3>" + _table(["site", "function", "per step"], grow, num_from=2))
    bd = mem.get("breakdown")
    if isinstance(bd, dict) and isinstance(bd.get("parts"), dict):
        out.append(share_bar(list(bd["parts"].items()),
                             title=f"Memory at {bd.get('at', 'peak')} (step {bd.get('step')})"))
    return "".join(out) if len(out) > 1 else ""


def section_nan(m: dict[str, Any]) -> str:
    nan = m.get("nan")
    if not isinstance(nan, dict) or not nan.get("series"):
        return ""
    cols = nan.get("series_columns") or []
    if "step" not in cols:
        return ""
    rows = nan["series"]
    idx = {c: i for i, c in enumerate(cols)}
    steps = [r[idx["step"]] for r in rows]
    curves = [(c.replace("_", " "), steps, [r[idx[c]] for r in rows]) for c in ("loss", "grad_norm")
              if c in idx]
    first = nan.get("first_nonfinite") or {}
    marks = [(first["step"], f"first non-finite {first.get('what', '')} (step {first['step']})")] \
        if isinstance(first.get("step"), (int, float)) else []
    positive = all(isinstance(v, (int, float)) and v > 0 for _n, _s, ys in curves for v in ys
                   if v is not None)
    chart = line_chart(curves, title="Loss and gradient norm per step", log_y=positive, marks=marks)
    return "<h2>Loss and gradient norm</h2>" + chart if chart else ""


def section_profile(m: dict[str, Any]) -> str:
    p = m.get("profile")
    if not isinstance(p, dict) or not p.get("top_ops"):
        return ""
    rows = [[o.get("name"), o.get("calls"), o.get("self_cpu_ms"), o.get("device_ms")]
            for o in p["top_ops"] if isinstance(o, dict)]
    head = f"profiled steps {p.get('steps')}, ranked by {p.get('top_ops_by', 'time')}"
    out = ["<h2>Profiler: top ops</h2>", f"<p>{esc(head)}</p>"]
    out.append(_table(["op", "calls / step", "self CPU ms", "device ms"], rows))
    hot = [[h.get("def"), h.get("func"), h.get("self_ms")] for h in p.get("python_hotspots") or []
           if isinstance(h, dict)]
    if hot:
        out.append("<h3>Python hot spots</h3>" + _table(["where", "function", "self ms"], hot, num_from=2))
    return "".join(out)


def section_ranks(m: dict[str, Any]) -> str:
    r = m.get("ranks")
    if not isinstance(r, dict) or not r.get("per_rank"):
        return ""
    rows = [[x.get("rank"), x.get("steps"), x.get("median_step_ms"), x.get("median_lag_ms"),
             x.get("last_share")] for x in r["per_rank"] if isinstance(x, dict)]
    bars = [(f"rank {x.get('rank')}", x.get("median_step_ms"), None)
            for x in r["per_rank"] if isinstance(x, dict)]
    return ("<h2>Ranks</h2>" + _table(["rank", "steps", "median step ms", "median lag ms",
                                       "last to arrive"], rows)
            + bar_chart(bars, title="Median step time per rank", unit=" ms"))


def section_checkpoint(m: dict[str, Any]) -> str:
    c = m.get("checkpoint")
    if not isinstance(c, dict) or not c.get("entries"):
        return ""
    rows = [[e.get("key"), e.get("role"), e.get("type"), e.get("tensors"), e.get("bytes"),
             ", ".join(f"{k} {v}" for k, v in (e.get("dtypes") or {}).items())]
            for e in c["entries"] if isinstance(e, dict)]
    head = f"{c.get('format', '')} · judged as {c.get('judged_as', '')} · {c.get('files', 1)} file(s)"
    return ("<h2>Checkpoint contents</h2><p>" + esc(head) + "</p>"
            + _table(["key", "role", "type", "tensors", "bytes", "dtypes (elements)"], rows, num_from=3))


def section_trials(m: dict[str, Any]) -> str:
    trials = m.get("trials")
    if isinstance(trials, dict):
        trials = trials.get("trials")
    if not isinstance(trials, list) or not trials:
        return ""
    bars = [(t.get("name", "?"), t.get("speedup"), (t.get("spread") or 0) * (t.get("speedup") or 0))
            for t in trials if isinstance(t, dict) and isinstance(t.get("speedup"), (int, float))]
    rows = [[t.get("name"), t.get("verdict"), t.get("speedup"), t.get("baseline_step_ms"),
             t.get("treated_step_ms"), t.get("loss_max_rel_diff"), t.get("fix") or t.get("reason")]
            for t in trials if isinstance(t, dict)]
    return ("<h2>Treatments tried</h2>"
            + bar_chart(bars, title="Speed-up over the baseline (bar: median; line: spread)",
                        unit="×", reference=1.0)
            + _table(["trial", "verdict", "speed-up", "baseline ms", "treated ms", "loss drift",
                      "fix / reason"], rows))


SECTIONS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("steps", section_steps), ("memory", section_memory), ("nan", section_nan),
    ("profile", section_profile), ("ranks", section_ranks), ("checkpoint", section_checkpoint),
    ("trials", section_trials),
]
