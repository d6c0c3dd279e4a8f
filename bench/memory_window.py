"""Whole-run cost of the memory sampler's allocation-site window, in one process, side by side
with the bare script.

Each round runs the workload script (``runpy``) bare, then under a probe's instruments (the
harness core, as the child process installs them; default ``checkup``), alternating which goes
first, and times the whole script (model build, every step, the window's start and finish;
not the Python/torch start-up, which would only dilute the ratio). Prints per round the two
times, the ratio, whether the site window opened and what it cost (``mem_sites.cost``), and
the median ratio over the rounds.

The default workload, ``bench/workloads/cpu_pyheavy.py``, stands in for the accelerate/BERT
example of issue 13 (whole run 1.87x: four steps under tracemalloc at 300 ms each, then a 2.8 s
pause): a heavy step that builds many small Python objects and keeps 64 KiB of buffers a step
(the host heap rises, the window opens on the host: dispatch mode + tracemalloc).

    python bench/memory_window.py [--rounds 3] [--probe checkup] [-- --steps 30 --objs 20000]

Acceptance (issue 13, item 19): the whole run under checkup <= 1.2x bare.
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
DEFAULT = ROOT / "bench" / "workloads" / "cpu_pyheavy.py"


def run_script(script: str, args: list[str]) -> float:
    argv = sys.argv
    sys.argv = [script, *args]
    t = time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    return time.perf_counter() - t


def run_probe(probe: str, script: str, args: list[str]) -> tuple[float, dict | None, int]:
    from torchdoctor.pipeline.registry import instruments_for
    from torchdoctor.memory import session
    from torchdoctor.runner.context import HarnessContext
    from torchdoctor.runner.core import Core
    from torchdoctor.runner.rundir import EVENTS, EvidenceWriter

    session.reset()
    d = tempfile.mkdtemp(prefix="td-memwindow-")
    writer = EvidenceWriter(d)
    ctx = HarnessContext(probe, d, {"steps": 0}, writer)
    core = Core(ctx, [c() for c in instruments_for(probe)])
    t = time.perf_counter()
    core.install()
    try:
        run_script(script, args)
    finally:
        core.uninstall()
        writer.close()
    wall = time.perf_counter() - t
    events = [json.loads(line) for line in open(Path(d) / EVENTS)]
    sites = next((e for e in reversed(events) if e["kind"] == "mem_sites"), None)
    return wall, sites, ctx.step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", default="checkup")
    ap.add_argument("--script", default=str(DEFAULT))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="bare runs first, not counted (the first run in a process pays torch's "
                         "lazy initialisation: it read 0.4-0.7x in the first round without one)")
    ap.add_argument("--json", dest="json_out", help="write the rounds here")
    ap.add_argument("wargs", nargs=argparse.REMAINDER, help="-- arguments of the script")
    a = ap.parse_args()
    wargs = [w for w in a.wargs if w != "--"]
    from overhead import machine

    print(f"machine: {machine()}; probe {a.probe}; {Path(a.script).name} {' '.join(wargs)}")
    for _ in range(a.warmup):
        run_script(a.script, wargs)
    rows = []
    for r in range(a.rounds):
        first_bare = r % 2 == 0
        if first_bare:
            bare = run_script(a.script, wargs)
        under, sites, steps = run_probe(a.probe, a.script, wargs)
        if not first_bare:
            bare = run_script(a.script, wargs)
        w = None
        if sites:
            w = {k: sites.get(k) for k in ("steps", "cost", "cut", "skipped", "partial")}
        rows.append({"bare_s": bare, "probe_s": under, "ratio": under / bare, "steps": steps,
                     "window": w})
        print(f"round {r + 1}: bare {bare:.2f} s, {a.probe} {under:.2f} s, "
              f"ratio {under / bare:.2f}x; window: {json.dumps(w) if w else 'not opened'}",
              flush=True)
    med = statistics.median(x["ratio"] for x in rows)
    print(f"median whole-run ratio {a.probe}/bare: {med:.2f}x over {len(rows)} rounds "
          f"(worst {max(x['ratio'] for x in rows):.2f}x)")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"rounds": rows, "median_ratio": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
