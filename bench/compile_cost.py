"""Cost of ``torchdoctor compile``'s diagnostics over the script's own run (same compile).

Configurations, alternating each round (a busy neighbour slows all alike), whole-run wall time
of the healthy compiled CNN (tests/fixtures/scripts/compile/healthy_cnn.py, 30 steps):

* ``bare``     python SCRIPT --backend B (no torchdoctor)
* ``run``      the harness with only the step clock (probe ``run``)
* ``compile``  the ``compile`` probe's run (dynamo_diag + dynamo_counters), no eager trial

Inductor's on-disk caches are disabled in every run (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``):
otherwise the first run compiles and the later ones load, which is the order of the configs,
not their cost. The probe's own cost beyond the script's compile time is ``compile / bare`` (harness start-up
included) and ``compile / run`` (the diagnostics alone). Acceptance (issue 19): compile / bare
≤ 1.10 with inductor.

    python bench/compile_cost.py --backend inductor --rounds 3
    python bench/compile_cost.py --backend aot_eager --rounds 5 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from overhead import machine  # noqa: E402

SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "compile" / "healthy_cnn.py"
KINDS = ("bare", "run", "compile")
CHILD = ("import json, sys\n"
         "from torchdoctor.pipeline.run import run_probe\n"
         "r = run_probe(sys.argv[1], sys.argv[2], sys.argv[3:], "
         "{'steps': 0, 'timeout': float(%r), 'quiet': True})\n"
         "print(json.dumps({'findings': [f.code for f in r.findings], "
         "'compile': r.metrics.get('compile')}))\n")


def run_once(kind: str, backend: str, timeout: float) -> dict:
    args = [str(SCRIPT), "--backend", backend]
    cmd = [sys.executable, *args] if kind == "bare" else [sys.executable, "-c", CHILD % timeout, kind, *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")  # every run compiles from scratch
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{kind} run failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    out = {"wall_s": wall}
    if kind != "bare":
        out.update(json.loads(p.stdout.strip().splitlines()[-1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    samples: dict[str, list[dict]] = {k: [] for k in KINDS}
    for r in range(a.rounds):
        for k in (KINDS if r % 2 == 0 else tuple(reversed(KINDS))):
            samples[k].append(run_once(k, a.backend, a.timeout))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {samples[k][-1]['wall_s']:.2f} s" for k in KINDS),
              file=sys.stderr, flush=True)
    med = {k: statistics.median(s["wall_s"] for s in samples[k]) for k in KINDS}
    comp = (samples["compile"][-1].get("compile") or {})
    summary = {"machine": machine(), "backend": a.backend, "rounds": a.rounds,
               "wall_s": med, "x_bare": med["compile"] / med["bare"], "x_run": med["compile"] / med["run"],
               "compile_s": comp.get("compile_s"), "findings": samples["compile"][-1].get("findings")}
    print(f"\n{summary['machine']}\nbackend {a.backend}, {a.rounds} alternating rounds; whole-run wall")
    for k in KINDS:
        print(f"{k:<8} {med[k]:8.2f} s  (min {min(s['wall_s'] for s in samples[k]):.2f}, "
              f"max {max(s['wall_s'] for s in samples[k]):.2f})")
    print(f"compile/bare {summary['x_bare']:.3f}  compile/run {summary['x_run']:.3f}  "
          f"(dynamo compile {summary['compile_s']} s inside each run)")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    return 0 if summary["x_bare"] <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
