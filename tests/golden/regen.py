"""Regenerate the golden set: the normalised `--json` of every headed CPU fixture script and of
every checkpoint fixture.

    .venv/bin/python tests/golden/regen.py                 # everything
    .venv/bin/python tests/golden/regen.py nan/explode.py  # some scripts (relative to tests/fixtures/scripts)
    .venv/bin/python tests/golden/regen.py --ckpt          # the checkpoint fixtures only
    .venv/bin/python tests/golden/regen.py --check [...]   # compare with the committed files, write nothing
    .venv/bin/python tests/golden/regen.py --out DIR       # write under DIR instead (run twice, diff)

Scripts: each fixture's header (tests/fixture_runs.py) gives the command; the run's report is
written, normalised, to tests/golden/scripts/<relative path>.json with the exit code. GPU-only
fixtures (`# requires: cuda` / `2 gpus`) and `# e2e: skip` fixtures get no golden here.
Checkpoints: tests/golden/ckpt_driver.py builds each fixture of builders.EXPECTED in a temp folder
and audits it (`checkpoint-audit --json [args]`); one file per fixture name in
tests/golden/checkpoint/<name>.json.

Masked (normalise() in tests/fixture_runs.py, whose NORMALISED text is the full list; found by
running the whole regen twice and diffing, and once more on a calmer box):
- the tool version and the context's python/torch/cuda versions;
- every float (times, shares, losses, grad norms, measured bytes per step);
- in text: numbers with a decimal point, a %, a byte or time unit (ms, s, min, h), numbers with
  thousands separators; the checkout path, the Python install, temp folders, pids, memory
  addresses, gloo ip:port (and a fixed-width cut after it);
- integers under measured keys (heap, rss, *_bytes, *_ms, *_s, pid(s), time*, mem*, *until*,
  samples, events, *_per_step);
- in metrics: lists of numbers (timelines, series); artifact paths;
- timing-dependent parts: the memory probe's time-budgeted tracemalloc window (its notes; keys
  site_window, and python_sites / skipped in metrics), not_growth reasons, thread stacks of a
  timed-out run ("<stack>"), rankings by measured time (top_ops, python_hotspots: "<ranked>");
- a run killed at --timeout: its metrics and skipped rules ("<timeout-run>"), steps_done and
  "killed after N steps";
- findings that are host load (cpu-oversubscribed with other_processes_cores: the shared box,
  not the script), and status "findings" when nothing else is left ("ok").
Kept: codes, severities, skills, docs links, titles and fixes (numbers masked as above),
skipped rules with their reasons, evidence keys and deterministic values (steps, lines, module
names, counts), the metrics' key structure, status, exit code.

Load-sensitive (seen on the shared 2-core box): dist/hang.py (at --timeout 12 the ranks may
still be importing torch: script-hung instead of collective-hang), memory/leak_buffers.py (the
tracemalloc window runs out of budget: memory-growth info instead of error); the goldens are
from runs where the box was calm enough. GPU-only fixtures have no golden (made here on CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fixture_runs import GOLDEN, SCRIPTS, dumps, headed_fixtures, launch, normalise, read_header  # noqa: E402


def script_golden(run) -> dict:
    return {"exit": run.returncode, "codes": sorted(run.codes), "report": normalise(run.report)}


def ckpt_goldens() -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ck.json"
        subprocess.run([sys.executable, str(HERE / "ckpt_driver.py"), str(out)], check=True, timeout=600)
        raw = json.loads(out.read_text())
    return {name: {"args": r["args"], "exit": r["exit"],
                   "codes": sorted(f"{f['code']}@{f['severity']}" for f in r["report"]["findings"]),
                   "report": normalise(r["report"])} for name, r in raw.items()}


def main(argv: list[str]) -> int:
    out_root = GOLDEN
    if "--out" in argv:  # write elsewhere (two runs to diff)
        i = argv.index("--out")
        out_root = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    check = "--check" in argv
    ckpt_only = "--ckpt" in argv
    names = [a for a in argv if not a.startswith("--")]
    bad = 0
    if not ckpt_only:
        heads = [read_header(SCRIPTS / n) for n in names] if names else headed_fixtures()
        for h in heads:
            if h is None or h.requires or h.skip:
                continue
            run = launch(h)
            text = dumps(script_golden(run))
            target = out_root / h.golden.relative_to(GOLDEN)
            if check:
                same = target.exists() and target.read_text() == text
                bad += not same
                print(("same " if same else "DIFF ") + h.rel, flush=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
                print(f"{h.rel}: exit {run.returncode} {sorted(run.codes)}", flush=True)
    if ckpt_only or not names:
        for name, g in ckpt_goldens().items():
            p = out_root / "checkpoint" / f"{name}.json"
            text = dumps(g)
            if check:
                same = p.exists() and p.read_text() == text
                bad += not same
                print(("same " if same else "DIFF ") + f"checkpoint/{name}", flush=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
                print(f"checkpoint/{name}: exit {g['exit']} {g['codes']}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
