"""Real public scripts on the GPU, each probe's printed numbers against the script's own.

Some public training scripts time themselves the careful way: karpathy/llm.c's
``train_gpt2.py`` calls ``torch.cuda.synchronize()`` before it prints each step's milliseconds
and prints ``torch.cuda.max_memory_allocated()`` at the end. This runs such a script plainly and
under each probe (``--steps 0``: the script's own loop bounds the run, so it prints its numbers in
the same process), in alternating rounds, and compares in each probed run:

* the per-step wall series torchdoctor recorded vs the script's printed step times, the same
  steps (the first ``--skip`` left out: warm-up), means, ±10 %;
* torchdoctor's printed median step time vs the script's median over the same steps, ±10 %;
* torchdoctor's peak allocated (cuda_end) vs the script's printed peak, ±5 % (the script resets
  the peak counter before its loop; torchdoctor's is the whole run's: a larger figure there is a
  pre-loop peak, noted);
* the run's wall time vs the plain runs' (whole-run overhead), and its findings.

The scripts are not in this repository (``.gpucarry/``, git-ignored, carried to the device
machine; docs/realworld.md says how they were fetched). Writes ``printed_truth.json`` and
``printed_truth.txt`` under ``--out``; exits 1 when a row is out of tolerance.

    python3 bench/printed_truth.py --case llmc --out $OUT/llmc --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpucarry"
TOL_STEP, TOL_PEAK = 0.10, 0.05

CASES = {
    # llm.c's GPT-2 (124M, d12) from scratch, bf16 autocast, flash attention, TF32, 1 GPU
    "llmc": {
        "cwd": "llmc",
        "argv": ["train_gpt2.py", "--input_bin", str(CARRY / "tok" / "train.bin"), "--model", "d12",
                 "--batch_size", "16", "--sequence_length", "1024", "--total_batch_size", "16384",
                 "--dtype", "bfloat16", "--flash", "1", "--tensorcores", "1", "--num_iterations", "40",
                 "--write_tensors", "0", "--device", "cuda"],
        "pythonpath": [str(CARRY / "shim")],  # tiktoken's BPE file needs the network: a stand-in
        "step": re.compile(r"^step\s+(\d+)/\d+ \| .*\(([\d.]+) ms \|"),
        "peak_mib": re.compile(r"^peak memory consumption: (\d+) MiB"),
    },
}
CASES["llmc_compile"] = {**CASES["llmc"], "argv": CASES["llmc"]["argv"] + ["--compile", "1"]}


def run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int, float, str, str]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, e.stdout or "", e.stderr or ""
        out, err = (x.decode() if isinstance(x, bytes) else x for x in (out, err))
    return rc, time.monotonic() - t0, out, err


def parse(case: dict, text: str) -> dict:
    steps, peak = {}, None
    for line in text.splitlines():
        m = case["step"].match(line.strip())
        if m:
            steps[int(m.group(1))] = float(m.group(2))
        m = case["peak_mib"].match(line.strip())
        if m:
            peak = int(m.group(1)) * 2**20
    return {"step_ms": steps, "peak_bytes": peak}


def compare(rows: list, name: str, rep: dict, own: dict, skip: int) -> None:
    def row(what, got, truth, tol, note=""):
        ok = None if tol is None else (truth is not None and got is not None
                                       and abs(got - truth) <= tol * truth)
        rows.append({"run": name, "what": what, "printed": got, "truth": truth,
                     "ratio": None if not (got and truth) else round(got / truth, 4),
                     "tol": tol, "ok": ok, "note": note})

    st = (rep.get("metrics") or {}).get("steps") or {}
    ser = dict(zip((st.get("series") or {}).get("step") or [], (st.get("series") or {}).get("wall_ms") or []))
    same = [k for k in sorted(own["step_ms"]) if k > skip and k in ser]
    if same:
        row("step ms, same steps (mean)", statistics.fmean(ser[k] for k in same),
            statistics.fmean(own["step_ms"][k] for k in same), TOL_STEP, f"steps {same[0]}-{same[-1]}")
        if st.get("median_step_ms") is not None:
            row("step ms (median, printed)", st["median_step_ms"],
                statistics.median(own["step_ms"][k] for k in same), TOL_STEP,
                f"torchdoctor's judged steps vs the script's steps {same[0]}-{same[-1]}")
    end = (((rep.get("metrics") or {}).get("memory") or {}).get("cuda_end") or {}).get("0") or {}
    if end.get("peak_allocated") and own["peak_bytes"]:
        row("peak allocated", end["peak_allocated"], own["peak_bytes"], TOL_PEAK,
            "the script's peak counter is reset before its loop; MiB, floored")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="llmc", choices=sorted(CASES))
    ap.add_argument("--probes", default="checkup,profile,memory,nan")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=5, help="the script's first steps left out (warm-up)")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    case = CASES[a.case]
    a.out.mkdir(parents=True, exist_ok=True)
    cwd = CARRY / case["cwd"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *case.get("pythonpath", []), env.get("PYTHONPATH", "")])
    rows: list = []
    runs: list = []
    plain_walls: list = []
    for r in range(1, a.rounds + 1):
        for probe in ["plain", *a.probes.split(",")]:
            if probe == "plain":
                cmd = [sys.executable, *case["argv"]]
            else:
                cmd = [sys.executable, "-m", "torchdoctor", probe, "--json", "--steps", "0",
                       "--timeout", str(int(a.timeout)), "--out", str(a.out / f"td-{probe}-{r}"), *case["argv"]]
            rc, wall, out, err = run(cmd, cwd, env, a.timeout + 60)
            own = parse(case, out if probe == "plain" else err)  # under torchdoctor the script's output goes to stderr
            rep = None
            if probe != "plain":
                try:
                    rep = json.loads(out)
                except ValueError:
                    rep = None
            name = f"{probe}#{r}"
            if probe == "plain":
                plain_walls.append(wall)
            elif rep is not None:
                compare(rows, name, rep, own, a.skip)
            runs.append({"run": name, "rc": rc, "wall_s": round(wall, 2), "own_steps": len(own["step_ms"]),
                         "own_median_ms": statistics.median(own["step_ms"].values()) if own["step_ms"] else None,
                         "own_peak_bytes": own["peak_bytes"],
                         "findings": [f"{f['code']}@{f['severity']}" for f in (rep or {}).get("findings", [])],
                         "titles": [f["title"] for f in (rep or {}).get("findings", [])],
                         "tail": (err if rc else "")[-1500:]})
            print(f"{name:12s} rc={rc} wall={wall:6.1f}s own_steps={len(own['step_ms'])} "
                  f"findings={runs[-1]['findings']}", flush=True)
    base = statistics.median(plain_walls) if plain_walls else None
    for x in runs:
        x["wall_ratio"] = round(x["wall_s"] / base, 3) if base else None
    bad = [x for x in rows if x["ok"] is False]
    lines = [f"{x['run']:12s} {x['what']:30s} printed={x['printed']!s:>14.14} truth={x['truth']!s:>14.14} "
             f"ratio={x['ratio']} {'OK' if x['ok'] else ('--' if x['ok'] is None else 'OUT')} {x['note']}"
             for x in rows]
    lines += [f"{x['run']:12s} rc={x['rc']} wall={x['wall_s']}s ratio_to_plain={x['wall_ratio']} "
              f"{' '.join(x['findings']) or 'no finding'}" for x in runs]
    text = "\n".join(lines)
    print(text)
    (a.out / "printed_truth.txt").write_text(text + "\n")
    (a.out / "printed_truth.json").write_text(json.dumps({"case": a.case, "rows": rows, "runs": runs}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
