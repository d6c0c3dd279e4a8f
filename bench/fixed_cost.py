"""Where a short script's extra wall time goes under a probe: start-up, run, teardown, report.

A tiny training script (a few dozen steps of a small MLP) stamps ``time.time()`` on its first
and last line into a file; the CLI writes ``meta.json["started"]`` when it launches the child,
and the child's last evidence write is the ``events.jsonl`` mtime. So per run:

* ``cli``: shell start -> the CLI launches the child (imports, option parsing);
* ``child_start``: launch -> the script's line after ``import torch`` (python, ``import torch``,
  instruments);
* ``script``: that line -> the last line (instruments inside the steps, the profiler window);
* ``teardown``: last line -> the child's last evidence (uninstall, end-of-run analysis);
* ``exit``: -> the CLI wrote ``result.json`` (the child's interpreter shut down);
* ``report``: -> the CLI exits (evidence read, rules, rendering, report files).

The bare run gives ``child_start`` (python + torch import), ``script`` and ``after`` (the
interpreter's exit) for reference.

    python bench/fixed_cost.py --probe profile --probe memory --rounds 3 [--python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = '''
import os, time
import torch
open(os.environ["TD_STAMP"], "a").write(f"first {time.time()}\\n")
torch.manual_seed(0)
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(STEPS):
    loss = m(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
open(os.environ["TD_STAMP"], "a").write(f"last {time.time()}\\n")
'''


def one(py: str, probe: str | None, script: Path, tmp: Path) -> dict[str, float]:
    stamp = tmp / "stamp.txt"
    stamp.unlink(missing_ok=True)
    out = tmp / f"out-{probe}"
    env = {**os.environ, "TD_STAMP": str(stamp), "PYTHONPATH": str(ROOT)}
    cmd = [py, str(script)] if probe is None else [py, "-m", "torchdoctor", probe, "--steps", "0",
                                                   "--out", str(out), "--json", str(script)]
    t0 = time.time()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    t1 = time.time()
    st = dict(line.split() for line in stamp.read_text().splitlines())
    first, last = float(st["first"]), float(st["last"])
    if probe is None:
        return {"total": t1 - t0, "child_start": first - t0, "script": last - first, "after": t1 - last}
    launched = json.loads((out / "run" / "meta.json").read_text())["started"]
    child_end = (out / "run" / "events.jsonl").stat().st_mtime
    exited = (out / "run" / "result.json").stat().st_mtime  # the CLI writes it once the child exited
    return {"total": t1 - t0, "cli": launched - t0, "child_start": first - launched,
            "script": last - first, "teardown": child_end - last, "exit": exited - child_end,
            "report": t1 - exited}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="td-fixed-"))
    script = tmp / "train.py"
    script.write_text(SCRIPT.replace("STEPS", str(a.steps)))
    rows: dict[str, list[dict[str, float]]] = {}
    for _ in range(a.rounds):
        for probe in [None, *a.probe]:
            rows.setdefault(probe or "bare", []).append(one(a.python, probe, script, tmp))
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{name:8s} " + "  ".join(f"{k} {v:.2f}s" for k, v in med.items()))


if __name__ == "__main__":
    main()
