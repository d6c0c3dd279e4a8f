"""Regenerate the goldens: every fixture's findings-only expectation, and the few whole-report
goldens that guard the JSON contract.

    .venv/bin/python tests/golden/regen.py                 # everything (scripts and checkpoints)
    .venv/bin/python tests/golden/regen.py nan/explode.py  # some scripts (relative to tests/fixtures/scripts)
    .venv/bin/python tests/golden/regen.py --findings [...]  # the expectations only, no whole report
    .venv/bin/python tests/golden/regen.py --ckpt          # the checkpoint fixtures only
    .venv/bin/python tests/golden/regen.py --check [...]   # compare with the committed files, write nothing
    .venv/bin/python tests/golden/regen.py --out DIR       # write under DIR instead (run twice, diff)

What is written (tests/golden/expect.py, tests/fixture_runs.py CONTRACT):
- for every headed CPU fixture script, tests/golden/scripts/<path>.expect.json: its exit code,
  status and findings as (code, severity, identifying evidence keys: expect.IDENTIFYING), sorted;
  for every checkpoint fixture (tests/golden/ckpt_driver.py, builders.EXPECTED),
  tests/golden/checkpoint/<name>.expect.json, with the audit's args as well;
- for the contract fixtures only (fixture_runs.CONTRACT: one per probe), the whole normalised
  report too: tests/golden/scripts/<path>.json, tests/golden/checkpoint/<name>.json
  (`{"exit", "codes", "report"}`; normalise() in tests/fixture_runs.py says what is masked, and
  the skipped-rules list is reduced to its entries' keys, so a new rule does not rewrite them).
GPU-only fixtures (`# requires: cuda` / `2 gpus`) and `# e2e: skip` fixtures get no file here:
the GPU ones are checked on their header's code set on the GPU box.

A new finding on an existing probe changes the expectation of the fixture that raises it (and
that fixture's whole-report golden if it is a contract fixture), nothing else: review the diff
of `regen.py PATH` for that fixture.

Load-sensitive (seen on the shared 2-core box): dist/hang.py (its --timeout, 20 s since
session 12, must leave two ranks time to start: at 12 s and load 5 they were still importing
torch.distributed; that import's frame is no longer taken for a collective), memory/leak_buffers.py (the
tracemalloc window runs out of budget: memory-growth info instead of error; its e2e test runs it
once more when the report says its site window stopped for its time budget); regenerate them on
a calm box.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from expect import expectation  # noqa: E402
from fixture_runs import (CONTRACT, GOLDEN, SCRIPTS, dumps, headed_fixtures, launch, normalise,  # noqa: E402
                          read_header)


def whole_report(exit_code: int, report: dict, codes) -> dict:
    return {"exit": exit_code, "codes": sorted(codes), "report": normalise(report)}


def ckpt_codes(report: dict) -> list[str]:
    return sorted(f"{f['code']}@{f['severity']}" for f in report["findings"])


def ckpt_files(name: str, r: dict) -> dict[str, dict]:
    """{relative path under GOLDEN: content} for one audited checkpoint fixture."""
    out = {f"checkpoint/{name}.expect.json": {"args": r["args"], **expectation(r["exit"], r["report"])}}
    if f"checkpoint/{name}" in CONTRACT:
        out[f"checkpoint/{name}.json"] = {"args": r["args"], **whole_report(r["exit"], r["report"],
                                                                             ckpt_codes(r["report"]))}
    return out


def audit_checkpoints() -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ck.json"
        subprocess.run([sys.executable, str(HERE / "ckpt_driver.py"), str(out)], check=True, timeout=600)
        return json.loads(out.read_text())


def script_files(h, run, findings_only: bool) -> dict[str, dict]:
    rel = h.golden.relative_to(GOLDEN).as_posix()  # scripts/<path>.json
    out = {rel[:-len(".json")] + ".expect.json": expectation(run.returncode, run.report)}
    if not findings_only and f"scripts/{h.rel}" in CONTRACT:
        out[rel] = whole_report(run.returncode, run.report, run.codes)
    return out


def write(files: dict[str, dict], out_root: Path, check: bool) -> int:
    bad = 0
    for rel, content in files.items():
        target, text = out_root / rel, dumps(content)
        if check:
            same = target.exists() and target.read_text() == text
            bad += not same
            print(("same " if same else "DIFF ") + rel, flush=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"{rel}: exit {content['exit']} {[f['code'] + '@' + f['severity'] for f in content.get('findings', [])]}"
                  if "findings" in content else f"{rel}: whole report", flush=True)
    return bad


def main(argv: list[str]) -> int:
    out_root = GOLDEN
    if "--out" in argv:  # write elsewhere (two runs to diff)
        i = argv.index("--out")
        out_root = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    check = "--check" in argv
    ckpt_only = "--ckpt" in argv
    findings_only = "--findings" in argv
    names = [a for a in argv if not a.startswith("--")]
    bad = 0
    if not ckpt_only:
        heads = [read_header(SCRIPTS / n) for n in names] if names else headed_fixtures()
        for h in heads:
            if h is None or h.requires or h.skip:
                continue
            bad += write(script_files(h, launch(h), findings_only), out_root, check)
    if ckpt_only or not names:
        for name, r in audit_checkpoints().items():
            files = ckpt_files(name, r)
            if findings_only:
                files = {k: v for k, v in files.items() if k.endswith(".expect.json")}
            bad += write(files, out_root, check)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
