"""Real-world bench: run fetched public training scripts plainly and under every probe.

    python bench/realworld.py --src /work/realworld/src --python /work/realworld/.venv/bin/python \\
        --checkout /work/main --out /tmp/rw [--cases nanogpt,dcgan] [--probes checkup,nan] \\
        [--rounds 1] [--plain-every 2] [--work DIR] [--timeout 600] [--no-nice]

For each case of ``bench/realworld_cases.py`` (scripts live OUTSIDE this repo, under --src):

1. prepares its synthetic data once (``WORK/<case>/``, in the format the script itself reads);
2. runs it plainly (``PYTHON script ARGS``; DDP cases ``PYTHON -m torch.distributed.run
   --standalone --nproc-per-node N``) and under each probe
   (``PYTHONPATH=CHECKOUT PYTHON -m torchdoctor PROBE --json --out D --steps 0 --timeout T
   [--nproc-per-node N] script ARGS``), each in a fresh working dir, alternating plain and probe runs
   (a plain run before the first probe, after every ``--plain-every`` probes and at the end) so the
   box's load touches both; every run is under ``nice -n 5`` unless ``--no-nice``;
3. runs ``checkpoint-audit --json`` on the checkpoints the first plain run wrote;
4. harm check: hashes the checkpoints and ``outputs`` of every run that ended by itself and compares
   each probed run's with the first plain run's (and the plain runs' among themselves, which tells
   a file that differs between any two runs from one a probe changed), likewise the script's
   output lines matching the case's ``compare`` regex;
5. peak RSS of each run's whole process tree (the command, the script, DataLoader workers, torchrun
   ranks, follow-up runs), summed over the tree, sampled every 0.2 s from /proc.

A case whose repository is not under --src, or whose modules --python cannot import, is skipped
with a line saying what is missing (the table's "Skipped" line).

Fairness of "whole-run overhead": ``--steps 0`` lets torchdoctor run the script to its own end, so
a plain and a probed run do the same training steps (the script's argv bounds them); the ratio is the
probed command's wall time (torchdoctor start-up, instruments, follow-up re-runs and the report
included: what a user waits for) over the median plain wall time of the same case, same round.
A probed run whose outcome is not the script's own exit (``stopped``, ``timeout``) is flagged.

The torchdoctor under test is the one in --checkout (nothing is installed into --python): the
child harness puts the package root on sys.path.

Writes ``OUT/realworld.json`` (every run) and ``OUT/realworld.md`` (tables that paste into
docs/realworld.md). Per-run stderr logs and --out folders are under ``OUT/runs/``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realworld_cases import Case, by_name  # noqa: E402

ALL_PROBES = ("checkup", "profile", "memory", "nan", "dist", "treat", "repro", "compile", "gradcheck")
# options a probe gets beyond the shared ones: treat's whole run is bounded by a budget
PROBE_OPTS = {"treat": ["--budget", "180"],
              "repro": ["--steps", "30"]}  # repro compares bounded runs (>= 1 step)
INTERNAL = "internal-error"


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and every process below it (one pass over /proc)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
            fields = st[st.rindex(b")") + 2:].split()  # fields[0] is stat's 3rd field (state)
            pid, ppid = int(d), int(fields[1])
            rss[pid] = int(fields[21]) * _PAGE
            kids.setdefault(ppid, []).append(pid)
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += kids.get(pid, [])
    return total


def _sample_tree_rss(root: int, done: threading.Event, peak: list) -> None:
    while not done.is_set():
        peak[0] = max(peak[0], _tree_rss(root))
        done.wait(0.2)


def harm_check(rec: dict, plains: list[dict]) -> str:
    """Compare a probed run's files and output lines with the first plain run's (see the module doc)."""
    ref = [r for r in plains if r["rc"] == 0]
    if not ref:
        return "no plain run ended by itself"
    if rec.get("outcome") != "exit":
        return f"not compared (outcome={rec.get('outcome')})"
    if "hashes" not in rec:
        return "—"
    first = ref[0]
    same, varies, differs = 0, [], []
    for name in sorted(set(first["hashes"]) | set(rec["hashes"])):
        want, got = first["hashes"].get(name), rec["hashes"].get(name)
        if want == got:
            same += 1
        elif len({r["hashes"].get(name) for r in ref}) > 1:
            varies.append(Path(name).name)
        else:
            differs.append(Path(name).name + (" (missing)" if got is None else ""))
    n_lines = len(first.get("lines", []))
    shown = bool(rec.get("lines")) or not first.get("lines")
    if not shown:  # repro keeps its runs' output in its report (result.json), not on the terminal
        n_lines = 0
    elif first.get("lines", []) != rec.get("lines", []):
        if len({tuple(r.get("lines", [])) for r in ref}) > 1:
            varies.append("output lines")
        else:
            differs.append("output lines")
    out = [f"identical ({same} files, {n_lines} lines)" if not differs else "DIFFERS: " + ", ".join(differs)]
    if not shown:
        out.append("the probe does not show the script's output lines")
    if varies:
        out.append("plain runs differ too: " + ", ".join(varies))
    return "; ".join(out)


def fmt(s: str, case_dir: Path, run_dir: Path, src: Path) -> str:
    return s.replace("{run}", str(run_dir)).replace("{case}", str(case_dir)).replace("{src}", str(src))


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.src = Path(a.src).resolve()
        self.python = a.python
        self.checkout = Path(a.checkout).resolve()
        self.out = Path(a.out).resolve()
        self.work = Path(a.work).resolve() if a.work else self.out / "work"
        self.timeout = a.timeout
        self.nice = [] if a.no_nice else ["nice", "-n", "5"]
        self.keep = a.keep_runs
        self.threads = a.threads
        self.runs: list[dict] = []
        self.audits: list[dict] = []
        self.skipped: list[dict] = []
        self.gpus = self._gpu_count()

    # ------------------------------------------------------------------ plumbing
    def _gpu_count(self) -> int:
        try:
            out = subprocess.run([self.python, "-c", "import torch; print(torch.cuda.device_count())"],
                                 capture_output=True, text=True, timeout=120)
            return int(out.stdout.strip().splitlines()[-1])
        except Exception:
            return 0

    def env(self, case: Case, case_dir: Path, run_dir: Path, probed: bool) -> dict:
        env = dict(os.environ)
        for k, v in case.env.items():
            env[k] = fmt(v, case_dir, run_dir, self.src)
        paths = []
        if probed:
            paths.append(str(self.checkout))
        if case.name.startswith("mingpt"):
            paths.append(str(self.src / "minGPT"))  # minGPT's README: pip install -e . (we add it instead)
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.pop("TORCHDOCTOR_DISABLE", None)
        if self.threads:  # same for plain and probed runs: the shared box is oversubscribed otherwise
            env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def missing(self, case: Case) -> str:
        """Why the case cannot run here ("" when it can): its fetched repository or a module."""
        if not (self.src / case.script).is_file():
            return (f"{case.script} not found: fetch github:{case.repo} and extract it to "
                    f"{self.src / case.folder} (docs/realworld.md, 'What was fetched')")
        if case.needs:
            probe = ("import importlib.util, sys; "
                     "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
            try:
                out = subprocess.run([self.python, "-c", probe, *case.needs], capture_output=True, text=True,
                                     timeout=120)
                absent = (out.stdout.strip() if out.returncode == 0
                          else f"(--python failed: {out.stderr.strip()[-200:]})")
            except (OSError, subprocess.TimeoutExpired) as e:
                absent = f"(--python failed: {e})"
            if absent:
                return f"{self.python} cannot import {absent}: pip install them into the bench venv"
        return ""

    def prepare(self, case: Case) -> Path:
        case_dir = self.work / case.name
        mark = case_dir / ".prepared"
        if not mark.exists():
            case_dir.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            subprocess.run([self.python, str(Path(__file__).with_name("realworld_cases.py")), "prepare",
                            case.name, str(case_dir), str(self.src)], check=True)
            mark.write_text(f"{time.perf_counter() - t0:.1f} s\n")
        return case_dir

    def new_run_dir(self, case: Case, case_dir: Path, tag: str) -> Path:
        run_dir = case_dir / tag
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        for d in case.dirs:
            (run_dir / d).mkdir(parents=True, exist_ok=True)
        for name, target in case.links:
            (run_dir / name).symlink_to(case_dir / fmt(target, case_dir, run_dir, self.src))
        return run_dir

    def script_argv(self, case: Case, case_dir: Path, run_dir: Path) -> tuple[str, list[str]]:
        return (str(self.src / case.script), [fmt(x, case_dir, run_dir, self.src) for x in case.args])

    def _exec(self, argv: list[str], cwd: Path, env: dict, log: Path) -> tuple[int, float, str, float]:
        """Run one command; return (rc, wall s, stdout, CPU s). CPU s = user+sys of every waited-for
        descendant (the script, its DataLoader workers, torchrun ranks, torchdoctor's follow-up runs):
        far less sensitive than wall time to the neighbours on a shared box. The peak RSS of the
        process tree is left in ``self.last_peak_mb``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as err:
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            p = subprocess.Popen(self.nice + argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err,
                                 start_new_session=True)
            peak = [0]
            done = threading.Event()
            sampler = threading.Thread(target=_sample_tree_rss, args=(p.pid, done, peak), daemon=True)
            sampler.start()
            try:
                so, _ = p.communicate(timeout=self.timeout + 60)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                rc, so = 124, b""
            finally:
                try:  # the run's whole process group (DataLoader workers, torchrun ranks) ends with it
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                if p.poll() is None:
                    p.wait()
                done.set()
                sampler.join()
            wall = time.perf_counter() - t0
            self.last_peak_mb = round(peak[0] / 2**20, 1)
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            return rc, wall, so.decode("utf-8", "replace"), cpu

    # ------------------------------------------------------------------ runs
    def plain(self, case: Case, case_dir: Path, tag: str, rnd: int) -> dict:
        run_dir = self.new_run_dir(case, case_dir, tag)
        script, args = self.script_argv(case, case_dir, run_dir)
        launch = ([self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={case.nproc}"]
                  if case.nproc else [self.python])
        log = self.out / "runs" / case.name / f"{tag}.log"
        rc, wall, out, cpu = self._exec(launch + [script] + args, run_dir, self.env(case, case_dir, run_dir, False),
                                        log)
        (log.with_suffix(".stdout")).write_text(out)
        ckpts = self.found_checkpoints(case, run_dir)
        rec = {"case": case.name, "probe": "plain", "round": rnd, "tag": tag, "rc": rc, "wall_s": round(wall, 2),
               "cpu_s": round(cpu, 2), "peak_rss_mb": self.last_peak_mb,
               "checkpoints": [str(p.relative_to(run_dir)) for p in ckpts], "run_dir": str(run_dir),
               "log": str(log), "outcome": "exit" if rc == 0 else None,
               "hashes": self.hashes(case, run_dir), "lines": self.lines(case, [log, log.with_suffix(".stdout")])}
        print(f"  {tag:<22} rc={rc} {wall:7.1f} s  cpu {cpu:6.1f} s  rss {self.last_peak_mb:7.1f} MB  "
              f"ckpts={len(ckpts)}", flush=True)
        self.runs.append(rec)
        return rec

    def probe(self, case: Case, case_dir: Path, probe: str, tag: str, rnd: int) -> dict:
        run_dir = self.new_run_dir(case, case_dir, tag)
        script, args = self.script_argv(case, case_dir, run_dir)
        rep_dir = self.out / "runs" / case.name / tag
        if rep_dir.exists():
            shutil.rmtree(rep_dir)
        opts = ["--json", "--out", str(rep_dir), "--steps", "0", "--timeout", str(self.timeout)]
        opts += PROBE_OPTS.get(probe, [])
        if case.nproc:
            opts += ["--nproc-per-node", str(case.nproc)]
        argv = [self.python, "-m", "torchdoctor", probe] + opts + [script] + args
        log = self.out / "runs" / case.name / f"{tag}.log"
        rc, wall, out, cpu = self._exec(argv, run_dir, self.env(case, case_dir, run_dir, True), log)
        rec = {"case": case.name, "probe": probe, "round": rnd, "tag": tag, "rc": rc, "wall_s": round(wall, 2),
               "cpu_s": round(cpu, 2), "peak_rss_mb": self.last_peak_mb,
               "run_dir": str(run_dir), "log": str(log), "argv": argv}
        rec.update(parse_report(out))
        ckpts = self.found_checkpoints(case, run_dir)
        rec["checkpoints"] = [str(p.relative_to(run_dir)) for p in ckpts]
        rec["hashes"] = self.hashes(case, run_dir)
        rec["lines"] = self.lines(case, [log])
        fs = " ".join(rec["findings"]) or "-"
        print(f"  {tag:<22} rc={rc} {wall:7.1f} s  cpu {cpu:6.1f} s  rss {self.last_peak_mb:7.1f} MB  "
              f"status={rec.get('status')} outcome={rec.get('outcome')} steps={rec.get('steps')} {fs}", flush=True)
        self.runs.append(rec)
        return rec

    def hashes(self, case: Case, run_dir: Path) -> dict:
        """sha256 of every checkpoint and output file the run wrote (a folder: of its files)."""
        out = {}
        for pat in case.checkpoints + case.outputs:
            for p in sorted(Path(x) for x in glob.glob(str(run_dir / pat))):
                files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
                for f in files:
                    out[str(f.relative_to(run_dir))] = hashlib.sha256(f.read_bytes()).hexdigest()
        return out

    def lines(self, case: Case, logs: list[Path]) -> list[str]:
        """The script's output lines the case compares (stdout of a plain run, stderr of a probed one)."""
        if not case.compare:
            return []
        rx = re.compile(case.compare)
        found = []
        for log in logs:
            if log.exists():
                found += [ln.rstrip() for ln in log.read_text("utf-8", "replace").splitlines() if rx.search(ln)]
        return sorted(found)

    def found_checkpoints(self, case: Case, run_dir: Path) -> list[Path]:
        found: list[Path] = []
        for pat in case.checkpoints:
            found += sorted(Path(p) for p in glob.glob(str(run_dir / pat)))
        return found

    def audit(self, case: Case, plain_rec: dict) -> None:
        run_dir = Path(plain_rec["run_dir"])
        for rel in plain_rec["checkpoints"]:
            path = run_dir / rel
            argv = [self.python, "-m", "torchdoctor", "checkpoint-audit", "--json", str(path)]
            env = dict(os.environ, PYTHONPATH=str(self.checkout))
            log = self.out / "runs" / case.name / f"audit-{Path(rel).name}.log"
            rc, wall, out, _ = self._exec(argv, self.out, env, log)
            rec = {"case": case.name, "checkpoint": rel, "rc": rc, "wall_s": round(wall, 2)}
            rec.update(parse_report(out))
            print(f"  audit {rel:<40} rc={rc} {' '.join(rec['findings']) or '-'}", flush=True)
            self.audits.append(rec)
        missing = [p for p in case.checkpoints if not glob.glob(str(run_dir / p))]
        if missing:
            self.audits.append({"case": case.name, "checkpoint": ", ".join(missing), "rc": None,
                                "findings": [], "status": "not written by the plain run"})

    # ------------------------------------------------------------------ one case
    def run_case(self, case: Case, probes: list[str], rounds: int, plain_every: int) -> None:
        wanted = [p for p in probes if p in case.probes]
        missing = self.missing(case)
        if missing:
            self.skipped.append({"case": case.name, "reason": missing})
            print(f"{case.name}: skipped ({missing})", flush=True)
            return
        if case.needs_gpu and self.gpus < case.needs_gpu:
            self.skipped.append({"case": case.name, "reason": f"needs {case.needs_gpu} GPUs, found {self.gpus}"})
            print(f"{case.name}: skipped (needs {case.needs_gpu} GPUs, found {self.gpus})", flush=True)
            return
        print(f"{case.name}: {case.what}", flush=True)
        case_dir = self.prepare(case)
        for rnd in range(1, rounds + 1):
            first = self.plain(case, case_dir, f"r{rnd}-plain-0", rnd)
            if rnd == 1:
                self.audit(case, first)
            n_plain = 1
            for i, probe in enumerate(wanted, 1):
                self.probe(case, case_dir, probe, f"r{rnd}-{probe}", rnd)
                if i % plain_every == 0 or i == len(wanted):
                    self.plain(case, case_dir, f"r{rnd}-plain-{n_plain}", rnd)
                    n_plain += 1
        if not self.keep:
            for rec in self.runs:
                if rec["case"] == case.name and rec["tag"] != "r1-plain-0":
                    shutil.rmtree(rec["run_dir"], ignore_errors=True)

    # ------------------------------------------------------------------ summary
    def summary(self) -> list[dict]:
        rows = []
        cases = sorted({r["case"] for r in self.runs}, key=lambda c: [x["case"] for x in self.runs].index(c))
        for c in cases:
            plains = [r for r in self.runs if r["case"] == c and r["probe"] == "plain"]
            plain_ok = [r for r in plains if r["rc"] == 0]
            probes = [r for r in self.runs if r["case"] == c and r["probe"] != "plain"]
            for p in sorted({r["probe"] for r in probes}, key=ALL_PROBES.index):
                recs = [r for r in probes if r["probe"] == p]
                walls = [r["wall_s"] for r in recs]
                rounds_ = {x["round"] for x in recs}
                base = [r["wall_s"] for r in plain_ok if r["round"] in rounds_]
                plain_s = statistics.median(base) if base else None
                probe_s = statistics.median(walls)
                base_cpu = [r["cpu_s"] for r in plain_ok if r["round"] in rounds_]
                plain_cpu = statistics.median(base_cpu) if base_cpu else None
                probe_cpu = statistics.median([r["cpu_s"] for r in recs])
                last = recs[-1]
                plain_rss = [r["peak_rss_mb"] for r in plain_ok if r.get("peak_rss_mb") and r["round"] in rounds_]
                probe_rss = [r["peak_rss_mb"] for r in recs if r.get("peak_rss_mb")]
                plain_ckpts = set(plains[0]["checkpoints"]) if plains else set()
                notes = []
                if plains and plains[0]["rc"] != 0:
                    notes.append(f"plain rc={plains[0]['rc']}")
                if last.get("status") == "crashed":
                    notes.append("SCRIPT CRASHED under the probe")
                if last.get("outcome") not in (None, "exit"):
                    notes.append(f"outcome={last.get('outcome')}")
                lost = sorted(plain_ckpts - set(last.get("checkpoints", [])))
                if lost:
                    notes.append("checkpoint not written: " + ", ".join(lost))
                if last.get("crash"):
                    notes.append("crash: " + last["crash"])
                rows.append({
                    "case": c, "probe": p, "rc": last["rc"], "status": last.get("status"),
                    "findings": _union([r.get("findings", []) for r in recs]),
                    "internal": _union([r.get("internal", []) for r in recs]),
                    "steps": last.get("steps"),
                    "plain_s": round(plain_s, 1) if plain_s else None, "probe_s": round(probe_s, 1),
                    "ratio": round(probe_s / plain_s, 2) if plain_s else None,
                    "plain_cpu_s": round(plain_cpu, 1) if plain_cpu else None, "probe_cpu_s": round(probe_cpu, 1),
                    "cpu_ratio": round(probe_cpu / plain_cpu, 2) if plain_cpu else None,
                    "plain_rss_mb": round(statistics.median(plain_rss)) if plain_rss else None,
                    "probe_rss_mb": round(max(probe_rss)) if probe_rss else None,
                    "harm": "; ".join(dict.fromkeys(harm_check(r, plains) for r in recs)), "notes": notes})
        return rows

    def write(self, meta: dict) -> None:
        rows = self.summary()
        data = {"meta": meta, "rows": rows, "audits": self.audits, "skipped": self.skipped, "runs": self.runs}
        (self.out / "realworld.json").write_text(json.dumps(data, indent=1))
        (self.out / "realworld.md").write_text(markdown(meta, rows, self.audits, self.skipped))
        print(f"\nwrote {self.out / 'realworld.json'} and {self.out / 'realworld.md'}")


def parse_report(stdout: str) -> dict:
    """Pull what the tables need out of one --json report (or say why there is none)."""
    try:
        rep = json.loads(stdout)
    except (json.JSONDecodeError, ValueError):
        return {"status": "no-json", "findings": [], "internal": [], "outcome": None, "steps": None}
    findings = rep.get("findings") or []
    codes = [f"{f.get('code')}@{f.get('severity')}" for f in findings]
    internal = [f"{f.get('title', '')}"[:160] for f in findings if f.get("code") == INTERNAL]
    metrics = rep.get("metrics") or {}
    run = metrics.get("run") or {}
    steps = metrics.get("steps") or {}
    crash = None
    for f in findings:
        if f.get("code") == "script-crashed":
            crash = f"{f.get('title', '')}"[:200]
    return {"status": rep.get("status"), "findings": codes, "internal": internal,
            "outcome": run.get("outcome"), "crash": crash, "detail": probe_detail(metrics),
            "steps": run.get("steps", steps.get("count") if isinstance(steps, dict) else None),
            "titles": {f"{f.get('code')}": f"{f.get('title', '')}"[:300] for f in findings}}


def probe_detail(metrics: dict) -> str:
    """One line on what the many-run probes measured (treat's verdicts, repro's comparison,
    compile's graphs and speed-up, gradcheck's Functions), for the bench tables."""
    out = []
    for t in metrics.get("trials") or []:
        if isinstance(t, dict) and t.get("verdict") != "skipped":
            sp = t.get("speedup")
            out.append(f"{t.get('name')}={t.get('verdict')}" + (f" {sp:.2f}x" if isinstance(sp, (int, float)) else ""))
    rp = metrics.get("repro")
    if isinstance(rp, dict):
        out.append("identical" if rp.get("identical") else
                   f"diverged at step {rp.get('first_divergent_step')} "
                   f"({(rp.get('diverged') or {}).get('what')})" if rp.get("compared") else
                   f"not compared: {rp.get('reason')}")
    cp = metrics.get("compile")
    if isinstance(cp, dict):
        out.append(f"graphs={cp.get('graphs')} breaks={len(cp.get('graph_breaks') or [])} "
                   f"recompiles={cp.get('recompiles') if not isinstance(cp.get('recompiles'), list) else len(cp['recompiles'])} "
                   f"compile_s={cp.get('compile_s')} speedup={cp.get('speedup')}")
    gc = metrics.get("gradcheck")
    if isinstance(gc, dict):
        out.append(f"custom Functions={len(gc.get('functions') or [])}")
    return "; ".join(out)


def _union(per_round: list[list[str]]) -> list[str]:
    """Every finding seen in any round, in first-seen order; "(k/n)" where it was not in every round."""
    seen: list[str] = []
    for xs in per_round:
        seen += [x for x in xs if x not in seen]
    n = len(per_round)
    out = []
    for x in seen:
        k = sum(x in xs for xs in per_round)
        out.append(x if k == n else f"{x} ({k}/{n})")
    return out


def _cell(xs) -> str:
    return "<br>".join(xs) if xs else "—"


def markdown(meta: dict, rows: list[dict], audits: list[dict], skipped: list[dict]) -> str:
    out = [f"Run {meta['date']} · checkout `{meta['checkout']}` @ `{meta['commit']}` · {meta['machine']} · "
           f"{meta['rounds']} round(s), plain run every {meta['plain_every']} probes, `nice -n 5`: "
           f"{meta['nice']}, OMP_NUM_THREADS={meta['threads'] or 'unset'}", "",
           "| case | probe | exit | steps | findings (code@severity) | internal errors | plain s | probe s | ratio "
           "| plain CPU s | probe CPU s | CPU ratio | peak RSS MB plain / probe | harm check | notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def x(v, suffix=""):
        if v is None:
            return "—"
        return f"{v:.2f}{suffix}" if suffix else f"{v}"

    for r in rows:
        out.append(f"| {r['case']} | {r['probe']} | {r['rc']} | {x(r.get('steps'))} | {_cell(r['findings'])} | "
                   f"{_cell(r['internal'])} | "
                   f"{x(r['plain_s'])} | {r['probe_s']} | {x(r['ratio'], '×')} | {x(r.get('plain_cpu_s'))} | "
                   f"{x(r.get('probe_cpu_s'))} | {x(r.get('cpu_ratio'), '×')} | "
                   f"{x(r.get('plain_rss_mb'))} / {x(r.get('probe_rss_mb'))} | {r.get('harm') or '—'} | "
                   f"{'; '.join(r['notes']) or ''} |")
    for key, label in (("ratio", "Whole-run wall ratio"), ("cpu_ratio", "Whole-run CPU ratio")):
        vals = [(r[key], r) for r in rows if r.get(key) is not None]
        if vals:
            worst = max(vals, key=lambda v: v[0])
            out += ["", f"{label} over {len(vals)} probed runs: median "
                        f"{statistics.median(v for v, _ in vals):.2f}×, worst {worst[0]:.2f}× "
                        f"({worst[1]['case']} / {worst[1]['probe']}); over 1.2×: {sum(v > 1.2 for v, _ in vals)}."]
    out += ["", "| case | checkpoint-audit of | exit | findings (code@severity) |", "|---|---|---|---|"]
    for a in audits:
        out.append(f"| {a['case']} | `{a['checkpoint']}` | {a['rc'] if a['rc'] is not None else '—'} | "
                   f"{_cell(a.get('findings', [])) if a['rc'] is not None else a.get('status', '')} |")
    if skipped:
        out += ["", "Skipped: " + "; ".join(f"{s['case']} ({s['reason']})" for s in skipped) + "."]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", help="folder holding the fetched repositories")
    ap.add_argument("--python", help="the bench venv's python (torch, lightning, ...)")
    ap.add_argument("--checkout", help="the torchdoctor checkout under test")
    ap.add_argument("--out")
    ap.add_argument("--from-json", metavar="PATH", help="only re-render the markdown of an earlier realworld.json")
    ap.add_argument("--work", default=None, help="scratch for data and run dirs (default OUT/work)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default all)")
    ap.add_argument("--probes", default=",".join(ALL_PROBES))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--plain-every", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="torchdoctor --timeout and plain-run bound")
    ap.add_argument("--no-nice", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS for every run, plain and probed (0: leave the environment's)")
    ap.add_argument("--keep-runs", action="store_true", help="keep every run dir (default: the first plain one)")
    a = ap.parse_args()
    if a.from_json:
        d = json.loads(Path(a.from_json).read_text())
        rows = d["rows"]
        if d.get("runs"):  # summarise again from the runs (the current summary and harm check)
            b = Bench.__new__(Bench)
            b.runs = d["runs"]
            rows = b.summary()
        print(markdown(d["meta"], rows, d["audits"], d["skipped"]), end="")
        return 0
    if not (a.src and a.python and a.checkout and a.out):
        ap.error("--src, --python, --checkout and --out are required")
    probes = [p.strip() for p in a.probes.split(",") if p.strip()]
    bad = [p for p in probes if p not in ALL_PROBES]
    if bad:
        ap.error(f"unknown probe(s) {bad}")
    cases = by_name(a.cases)
    b = Bench(a)
    b.out.mkdir(parents=True, exist_ok=True)
    try:
        commit = subprocess.run(["git", "-C", str(b.checkout), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        commit = "?"
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checkout": str(b.checkout),
            "commit": commit, "rounds": a.rounds, "threads": a.threads, "plain_every": a.plain_every, "nice": not a.no_nice,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {b.gpus} GPU(s)",
            "argv": sys.argv, "probes": probes, "cases": [c.name for c in cases]}
    t0 = time.perf_counter()
    try:
        for case in cases:
            b.run_case(case, probes, a.rounds, a.plain_every)
            b.write(meta)  # after each case, so a cut run still leaves its tables
    finally:
        meta["total_s"] = round(time.perf_counter() - t0, 1)
        b.write(meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
