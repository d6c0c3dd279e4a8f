"""Fixture scripts that carry their expected findings in their own header, run once per session.

Each runnable fixture under ``tests/fixtures/scripts/`` starts with a header of comment lines:

    # torchdoctor: checkup --steps 20 -- ARG ...   (the command, its options; after `--`: the script's args)
    # expect: dataloader-bound@error, unseeded-run@info   (or `# expect: none`: no finding at all)
    # requires: cuda | 2 gpus                        (optional: GPU-only fixtures)
    # e2e: skip REASON                               (optional: a fixture a test drives by hand)

`{tmp}` in the script's args is a fresh temp folder per run. A command with ``-m MODULE`` runs
the module from the folder that holds its top package (no script path is added). Every other
fixture runs with its own folder as the working directory and its file name as SCRIPT.

``run_fixture(path)`` runs one fixture under its header command with ``--json`` and caches the
result for the whole test session, so the end-to-end test (tests/test_fixtures.py) and any other
test that needs the same fixture under the same command share one launch. ``plan_runs`` (conftest,
at collection) launches the e2e tests' runs ahead in a background lane (tests/fixture_lanes.py).
``normalise(report)`` masks what differs between two runs of the same code (see NORMALISED).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import fixture_lanes

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
GOLDEN = ROOT / "tests" / "golden"

# Host load, not the script: the tests run on a shared 2-core box; cpu-oversubscribed raised
# because *other* processes load the machine (evidence `other_processes_cores`) may appear on any
# fixture. It is left out of the code set and of the golden comparison (and out of the goldens).
def host_noise(f: dict) -> bool:
    """cpu-oversubscribed from other processes, or an info-level memory-growth with no growing
    site named (a short run's heap drift on a loaded box: memory/eval_with_grad.py raised one,
    "full in ~12 min", in 2 of 5 fresh-clone CI runs). Such a finding's `sites` is the sentence
    saying why none was named; the named ones are `growing_sites` and `graph_growth`."""
    ev = f.get("evidence") or {}
    if f.get("code") == "cpu-oversubscribed" and "other_processes_cores" in ev:
        return True
    return (f.get("code") == "memory-growth" and f.get("severity") == "info"
            and not ev.get("graph_growth") and not ev.get("growing_sites"))


@dataclass
class Header:
    path: Path
    args: list[str]            # the torchdoctor command and its options (no --json)
    script_args: list[str]
    expect: set[str]           # {"code@severity"}
    requires: str = ""         # "", "cuda", "2 gpus"
    skip: str = ""             # e2e: skip REASON
    module: str = ""           # -m MODULE
    extra: dict = field(default_factory=dict)

    @property
    def rel(self) -> str:
        return self.path.relative_to(SCRIPTS).as_posix()

    @property
    def gpus(self) -> int:
        if not self.requires:
            return 0
        m = re.match(r"(\d+)\s*gpus?", self.requires)
        return int(m.group(1)) if m else 1

    @property
    def golden(self) -> Path:
        return GOLDEN / "scripts" / (self.rel + ".json")


HEADER_RE = re.compile(r"^#\s*(torchdoctor|expect|requires|e2e):\s*(.*?)\s*$")


def read_header(path: Path) -> Header | None:
    """The header of a fixture (the leading `# key: value` lines), None for a helper file."""
    vals: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = HEADER_RE.match(line)
        if not m:
            break
        vals[m.group(1)] = m.group(2)
    if "torchdoctor" not in vals:
        return None
    words = shlex.split(vals["torchdoctor"])
    args, script_args = (words[:words.index("--")], words[words.index("--") + 1:]) if "--" in words else (words, [])
    module = ""
    if "-m" in args:
        module = args[args.index("-m") + 1]
    exp = vals.get("expect", "none").strip()
    expect = set() if exp in ("", "none") else {e.strip() for e in exp.split(",") if e.strip()}
    skip = vals.get("e2e", "")
    skip = skip[len("skip"):].strip(" :-") if skip.startswith("skip") else ""
    return Header(path, args, script_args, expect, vals.get("requires", "").strip(), skip, module)


def headed_fixtures() -> list[Header]:
    """Every fixture script with a header, sorted by path."""
    out = []
    for p in sorted(SCRIPTS.rglob("*.py")):
        h = read_header(p)
        if h is not None:
            out.append(h)
    return out


def _module_cwd(path: Path, module: str) -> Path:
    d = path.parent
    for _ in module.split(".")[:-1]:
        d = d.parent
    return d


@dataclass
class Run:
    header: Header
    returncode: int
    report: dict
    stderr: str
    tmp: Path      # the run's {tmp} folder (exists while the test session lives)
    wall: float    # seconds the CLI took

    @property
    def codes(self) -> set[str]:
        return {f"{f['code']}@{f['severity']}" for f in self.report.get("findings", []) if not host_noise(f)}


def launch(h: Header, timeout: float = 300, keep: bool = False) -> Run:
    """One run of the fixture under its header command with --json. `{tmp}` (in options or the
    script's args) is a fresh folder: kept until the process exits when `keep` (tests read the
    pid files or rank dirs the run left there), else removed at once. The environment and temp
    folder are the session's as collected (fixture_lanes.ENV): not what a test running meanwhile
    set."""
    tmp = tempfile.mkdtemp(prefix="td-fixture-", dir=fixture_lanes.TMPDIR)
    if keep and fixture_lanes.SHARED is None:  # under xdist the controller removes the shared folder
        atexit.register(shutil.rmtree, tmp, True)
    try:
        sargs = [a.replace("{tmp}", tmp) for a in h.script_args]
        cmd, opts = h.args[0], [a.replace("{tmp}", tmp) for a in h.args[1:]]
        if h.module:
            cwd = _module_cwd(h.path, h.module)
            argv = [cmd, "--json", *opts, *sargs]
        else:
            cwd = h.path.parent
            argv = [cmd, "--json", *opts, h.path.name, *sargs]
        env = dict(fixture_lanes.ENV)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("COLUMNS", "120")
        if not h.requires:
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU fixtures stay on CPU on a GPU machine too
        t0 = time.monotonic()
        with fixture_lanes.Popen([sys.executable, "-m", "torchdoctor", *argv], cwd=cwd, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL) as p:
            fixture_lanes.SESSION.track(p, True)
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                raise RuntimeError(f"{h.rel}: no report within {timeout:.0f} s (killed):\n{err[-3000:]}") from None
            finally:
                fixture_lanes.SESSION.track(p, False)
        wall = time.monotonic() - t0
        if not out.strip():
            raise RuntimeError(f"{h.rel}: no JSON on stdout (exit {p.returncode}):\n{err[-3000:]}")
        report = json.loads(out)
        check_schema(h.rel, report)
        return Run(h, p.returncode, report, err, Path(tmp), wall)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


_SCHEMA: list = []


def check_schema(rel: str, report: dict) -> None:
    """Every report a fixture run produces validates against `torchdoctor schema` (issue 32).
    Where the dev extra is not installed (the GPU machine: no jsonschema, nothing installs there)
    the check is left out; tests/test_schema.py imports jsonschema itself, so CI always has it."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return
    from torchdoctor.schema import report_schema, validation_errors

    if not _SCHEMA:
        _SCHEMA.append(report_schema())
    errors = validation_errors(report, _SCHEMA[0])
    if errors:
        raise AssertionError(f"{rel}: the report breaks `torchdoctor schema`:\n" + "\n".join(errors[:20]))


JOBS = int(os.environ.get("FIXTURE_JOBS", "2"))


def _key(h: Header) -> tuple:
    return (h.rel, tuple(h.args), tuple(h.script_args))


def plan_runs(rels: list[str]) -> None:
    """Launch the session's runs of these fixtures (the e2e tests', in test order) in
    FIXTURE_JOBS - 1 background lanes (default 2: CI's two cores, the main thread being the
    other lane); see fixture_lanes. FIXTURE_JOBS=1: each run is launched by its first test."""
    heads = [read_header(SCRIPTS / rel) for rel in dict.fromkeys(rels)]
    jobs = [(_key(h), lambda h=h: launch(h, keep=True)) for h in heads if h is not None]
    if JOBS > 1 and jobs:
        fixture_lanes.SESSION.plan(jobs, JOBS - 1)


def run_fixture(rel: str | Path, command: str | None = None) -> Run:
    """The session's one run of a fixture under its header command (launched on first use,
    or by a background lane: plan_runs).

    `command`: the command line the calling test assumes (the header's `# torchdoctor:` text);
    a mismatch fails loudly instead of silently testing another run."""
    path = SCRIPTS / rel if not Path(rel).is_absolute() else Path(rel)
    h = read_header(path)
    if h is None:
        raise ValueError(f"{path} has no `# torchdoctor:` header")
    if command is not None:
        have = " ".join([*h.args, *(["--", *h.script_args] if h.script_args else [])])
        assert have == command, f"{h.rel}: header runs `{have}`, the test assumes `{command}`"
    return fixture_lanes.SESSION.once(_key(h), lambda: launch(h, keep=True))



@dataclass
class CliRun:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    wall: float    # seconds the CLI took


def run_cli_once(*argv: str, timeout: float = 300) -> CliRun:
    """The session's one run of ``torchdoctor ARGV`` (no fixture, e.g. ``demo --json``), from a
    fresh temp folder with the session's environment: tests that assert on the same command's
    output read this run instead of launching their own (a run that imports torch costs ~5 s
    of CPU on the 2-core box). Its error, if it has one, goes to every test that reads it."""
    def make() -> CliRun:
        tmp = tempfile.mkdtemp(prefix="td-cli-", dir=fixture_lanes.TMPDIR)
        try:
            env = dict(fixture_lanes.ENV)
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            env.setdefault("COLUMNS", "120")
            t0 = time.monotonic()
            with fixture_lanes.Popen([sys.executable, "-m", "torchdoctor", *argv], cwd=tmp, env=env,
                                     text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL) as p:
                fixture_lanes.SESSION.track(p, True)
                try:
                    out, err = p.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    raise RuntimeError(f"torchdoctor {' '.join(argv)}: no end within {timeout:.0f} s "
                                       "(killed)") from None
                finally:
                    fixture_lanes.SESSION.track(p, False)
            return CliRun(tuple(argv), p.returncode, out, err, time.monotonic() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return fixture_lanes.SESSION.once(("cli", tuple(argv)), make)

# ----------------------------------------------------------------------------- normalising
# The fixtures whose whole normalised report is a golden (tests/golden/<name>.json): one per probe,
# together every top-level key and every metrics section (the JSON contract). Every other fixture
# has a findings-only expectation (tests/golden/expect.py) and no whole-report golden.
CONTRACT = frozenset({
    "scripts/training/missing_zero_grad.py",  # checkup, a finding (the finding object's keys)
    "scripts/run/crash.py",                   # checkup of a crash: status crashed, metrics.memory/nan
    "scripts/profile/cpu_healthy.py",         # profile: metrics.profile, metrics.flops
    "scripts/memory/leak_loss_graph.py",      # memory: metrics.memory
    "scripts/nan/between_children.py",        # nan: metrics.nan, metrics.followups
    "scripts/repro/rng_python_shuffle.py",    # repro: metrics.repro
    "scripts/compile/recompiles.py",          # compile: metrics.compile
    "scripts/dist/healthy_ddp.py",            # dist on 2 gloo ranks: metrics.ranks, artifacts
    "scripts/gradcheck/mismatch.py",          # gradcheck: metrics.gradcheck
    "checkpoint/compile_prefix",              # checkpoint-audit: metrics.checkpoint
})

NORMALISED = """What normalise() masks in a CONTRACT fixture's report (what differs between two runs
of the same code; each item was seen to differ on one of those fixtures):
- top level: `version`; `context` values python/torch/cuda/driver/hostname (kept: keys, device, ranks);
  `skipped`: reduced to the keys of its entries (a new rule that does not apply is not a change
  of the contract; which rules a fixture skips is not asserted here);
- every float anywhere (measured times, shares, bytes per step, losses) -> "<float>";
- in text (titles, fixes, evidence strings): decimal numbers -> <num>, percentages -> <pct>,
  byte sizes ("1.2 MiB", "345 KiB") -> <bytes>, durations ("12 ms", "3 s") -> <dur>,
  the checkout path -> <root>, the Python install -> <python>, pythonX.Y -> python<ver>, temp
  dirs -> <tmp>, pids -> <pid>, memory addresses -> <addr>, thousands-separated numbers -> <int>;
- integer values under keys in VOLATILE_INT_KEYS or matching VOLATILE_KEY_RE (heap/RSS/byte
  counts, pids, *until*, counts of samples that depend on timing) -> "<int>";
- metrics: structure kept (dict keys), lists of numbers -> "<list>", other leaves by VOLATILE rules;
- `artifacts`: keys kept, paths masked;
- findings that are host load (cpu-oversubscribed with other_processes_cores) are dropped
  (and status "findings" with nothing left becomes "ok");
- memory/leak_loss_graph.py and the crash's memory section: the memory probe's time-budgeted
  tracemalloc window (its notes and the keys site_window / python_sites / skipped / partial /
  sites in metrics), non-growth reasons (not_growth), a growing graph's size at the last sample,
  a memory-growth's `impact` (present when the measured rate does not fill memory within the
  horizon: on a loaded box, 2026-11-28),
  the host heap trend's verdict (metrics.memory.trend.heap.growth: glibc's heap drifts by tens of
  KiB per step on a loaded box);
- profile/cpu_healthy.py: rankings by measured time (top_ops, python_hotspots: "<ranked>") and the
  profile window's Python call count;
- dist/healthy_ddp.py: torchrun's own return code (`launcher_returncode`: 1 in 2 of ~8 runs of a
  ranked fixture under load although both ranks reported exit 0).
Kept exactly: codes, severities, skills, docs, fix texts (numbers masked), evidence keys and their
deterministic values (lines, steps, names, ints), the metrics' key structure, status, exit code.
A fixture that times out or loses a rank to a signal is not a contract fixture: its findings-only
expectation (tests/golden/expect.py) holds no timing.
"""

# integer fields whose value is measured (bytes, sample counts, pids, timings in ns/us)
VOLATILE_INT_KEYS = {
    "baseline_heap", "heap", "rss", "pid", "pids", "bytes", "peak_bytes", "wall_ns", "dur_us",
    "points",  # samples a trend was fitted on: the sampler's cadence is timing
    "graph_nodes",  # a growing graph's size when the last sample was taken: timing
}
# keys whose presence or text depends on timing: the memory probe's time-budgeted tracemalloc
# window (site_window, python_sites, skipped in metrics) and a non-growth reason on noisy heaps
DROP_KEYS = {"site_window",
             "impact"}  # memory-growth's "warning although not full within the horizon": the measured rate
DROP_METRIC_KEYS = {"python_sites", "skipped", "partial",  # partial: a window cut by its time budget
                    "sites"}  # the memory site window: opened on early heap growth (timing)
MASK_TEXT_KEYS = {"not_growth"}
RANKED_KEYS = {"top_ops", "top_kernels", "python_hotspots"}  # rankings by measured time: "<ranked>"
VOLATILE_KEY_RE = re.compile(
    r"(.*until.*|_bytes|_heap|_rss|_ns|_us|_ms|_s|_pid|pids?|_kib|_mib|_gib|bytes_.*|heap_.*|rss_.*|"
    r"time.*|.*_time|elapsed.*|duration.*|timestamp.*|mem.*|.*_per_step|samples?|events?)$")

_TEXT_SUBS: list[tuple[re.Pattern, str]] = []


def _text_subs() -> list[tuple[re.Pattern, str]]:
    if not _TEXT_SUBS:
        root = re.escape(str(ROOT))
        tmp = re.escape(tempfile.gettempdir())
        pys = sorted({sys.base_prefix, sys.prefix, sys.exec_prefix}, key=len, reverse=True)
        _TEXT_SUBS.extend([
            # torch's own files, wherever the environment is (a venv in the checkout or not)
            (re.compile(r"[^\s'\"():]*/site-packages/"), "<site-packages>/"),
            (re.compile(root), "<root>"),
            *[(re.compile(re.escape(p) + r"(?=/)"), "<python>") for p in pys],
            (re.compile(r"python\d+\.\d+"), "python<ver>"),
            (re.compile(r"\(tracemalloc\): stopped [^\]\"]*?budget(?: \([^)]*\))?"), "(tracemalloc): stopped <budget>"),
            (re.compile(r"\d{1,3}(?:,\d{3})+"), "<int>"),
            (re.compile(r"\b\d+ Python calls\b"), "<int> Python calls"),  # counted under a clock
            (re.compile(r"\(\d+ now\)"), "(<int> now)"),  # a growing graph's size at the last sample
            (re.compile(tmp + r"/[^\s'\":,)\]]*"), "<tmp>"),
            (re.compile(r"/(?:var/folders|private/tmp)/[^\s'\":,)\]]*"), "<tmp>"),
            (re.compile(r"0x[0-9a-fA-F]{6,}"), "<addr>"),
            (re.compile(r"\b(pid|pids|process|PID)\s+\d+"), r"\1 <pid>"),
            (re.compile(r"-?\d+(?:\.\d+)?\s?(?:[KMGT]i?B|bytes|B)\b"), "<bytes>"),
            (re.compile(r"-?\d+(?:\.\d+)?\s?(?:ms|µs|us|ns|s|min|h|d|days?|hours?|minutes?)\b"), "<dur>"),
            (re.compile(r"-?\d+(?:\.\d+)?\s?%"), "<pct>"),
            (re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?"), "<num>"),
            (re.compile(r"-?\d+(?:\.\d+)?[eE][-+]?\d+"), "<num>"),
        ])
    return _TEXT_SUBS


def norm_text(s: str) -> str:
    for pat, rep in _text_subs():
        s = pat.sub(rep, s)
    return s


def _volatile(key: str) -> bool:
    return key in VOLATILE_INT_KEYS or bool(VOLATILE_KEY_RE.search(key))


def _norm(v, key: str = "", metrics: bool = False):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float):
        return "<float>"
    if isinstance(v, int):
        return "<int>" if _volatile(key) else v
    if isinstance(v, str):
        return norm_text(v)
    if isinstance(v, dict):
        drop = DROP_KEYS | (DROP_METRIC_KEYS if metrics else set())
        return {k: ("<text>" if k in MASK_TEXT_KEYS
                    else "<ranked>" if k in RANKED_KEYS and isinstance(x, list) else _norm(x, k, metrics))
                for k, x in v.items() if k not in drop}
    if isinstance(v, (list, tuple)):
        if metrics and any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return "<list>"
        if metrics and any(isinstance(x, list) for x in v):
            return "<list>"
        if _volatile(key) and all(isinstance(x, (int, float)) or x is None for x in v):
            return "<list>"
        return [_norm(x, key, metrics) for x in v]
    return v


def _skipped_shape(skipped):
    """The skipped rules reduced to their entries' keys: "<skipped: reason, rule>" whatever rules
    (and however many) are skipped; anything else is kept as it is (a change of the contract)."""
    if isinstance(skipped, list) and all(isinstance(e, dict) and set(e) == {"reason", "rule"} for e in skipped):
        return "<skipped: reason, rule>"
    return skipped


def normalise(report: dict) -> dict:
    """The report with everything that varies between runs of the same code masked (NORMALISED)."""
    out = {}
    for k, v in report.items():
        if k == "version":
            out[k] = "<version>"
        elif k == "context":
            out[k] = {ck: (cv if ck in ("device", "ranks", "backend") else "<masked>") for ck, cv in v.items()}
        elif k == "findings":
            out[k] = [_norm(f) for f in v if not host_noise(f)]
        elif k == "metrics":
            out[k] = _norm(v, k, metrics=True)
        elif k == "artifacts":
            out[k] = {ak: "<path>" for ak in v} if isinstance(v, dict) else _norm(v, k)
        elif k == "skipped":
            out[k] = _skipped_shape(v)
        else:
            out[k] = _norm(v, k)
    mem = out.get("metrics", {}).get("memory") if isinstance(out.get("metrics"), dict) else None
    heap = (mem.get("trend") or {}).get("heap") if isinstance(mem, dict) and isinstance(mem.get("trend"), dict) else None
    if isinstance(heap, dict) and "growth" in heap:
        heap["growth"] = "<heap-verdict>"  # the host heap's drift on a short run: host noise
    r = out.get("metrics", {}).get("run") if isinstance(out.get("metrics"), dict) else None
    if isinstance(r, dict) and "launcher_returncode" in r:
        r["launcher_returncode"] = "<int>"
    if out.get("status") == "findings" and not out.get("findings"):
        out["status"] = "ok"  # what it would say without the host-load finding dropped above
    return out


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
