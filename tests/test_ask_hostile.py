"""`ask` under hostile input (issue 14, items 4-5): bounded time, memory and output, never a traceback.

Inputs are built here: long digit runs, 1 MB of unstructured text, control bytes, deep nesting of
brackets, huge numbers inside known error texts, invalid UTF-8 on stdin, the known texts repeated.
Each input of at most 1 MB must be answered in under 1 s of CPU (measured as CPU time, not wall:
the test box is shared), with exit code 0/1/2, no traceback, and no control byte of the input on
stdout.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from torchdoctor.safe import _BIDI
from torchdoctor.errortext.table import BY_ID, KNOWN
from torchdoctor.triage.matcher import triage

MB = 1_000_000
CPU_LIMIT_S = 1.0
# what stdout may never carry: C0 controls but newline, DEL, C1 controls, bidi overrides
_BAD_OUT = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f" + _BIDI + "]")


def fixed_inputs():
    """(name, text): the shapes that were slow or crashed, each at most 1 MB."""
    rnd = random.Random(7)
    words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(1, 12)))
             for _ in range(3000)]
    prose = " ".join(rnd.choice(words) for _ in range(170_000))[:MB]
    oom = BY_ID["cuda-oom"].sample
    yield "digits", "1" * MB
    yield "digits-and-dots", "1." * (MB // 2)
    yield "oom-400-digit-size", oom.replace("2.00 GiB", "9" * 400 + " GiB")
    yield "oom-then-10kb-digits", "RuntimeError: CUDA out of memory. " + "1" * 10_000
    yield "oom-huge-sizes-every-line", ("CUDA out of memory. Tried to allocate " + "7" * 1000 + " MiB\n") * 900
    yield "prose-one-line", prose
    yield "prose-lines", "\n".join(prose[i:i + 80] for i in range(0, len(prose), 80))
    yield "printable-noise", "".join(chr(rnd.randrange(32, 127)) for _ in range(MB))
    yield "control-bytes", "".join(chr(rnd.choice([*range(0, 32), *range(127, 160)])) for _ in range(200_000))
    yield "escapes-in-error", ('Traceback (most recent call last):\n  File "/x/\x1b[31mtrain.py", line 3, in <module>\n'
                               "    x()\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB \x1b]0;t\x07"
                               "\x9b2J \u202eevil\x1b[1A\x1b[2K\n")
    yield "nested-parens", "(" * (MB // 2) + ")" * (MB // 2)
    yield "nested-brackets", "[" * MB
    yield "nested-mixed", "{[(<" * (MB // 4)
    yield "huge-step-and-loss", "step " + "9" * 5000 + " loss nan\n" + "step 1 loss 1e99999\nstep 2 loss nan\n"
    yield "huge-index", "IndexError: index " + "9" * 5000 + " is out of bounds for dimension 0 with size 3"
    yield "huge-shape-ints", ("RuntimeError: The size of tensor a (" + "9" * 5000 + ") must match the size of "
                              "tensor b (3) at non-singleton dimension 1")
    yield "nan-words", "nan " * (MB // 4)
    yield "loss-nan-lines", "loss: nan\n" * (MB // 10)
    yield "frame-openers", 'File "' * (MB // 6)
    yield "exception-lines", "AError\n" * (MB // 7)
    yield "key-after-1mb-line", "a" * (MB - 100) + " RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    yield "nccl-error-repeated", "NCCL error " * (MB // 11)
    yield "word-run", "a" * MB
    yield "newlines", "\n" * MB
    yield "carriage-returns", "\r" * MB
    yield "dotted-names", "A." * (MB // 2)
    yield "ansi-opener-run", "\x1b[" + "1;" * (MB // 2 - 2)
    yield "known-texts-repeated", ("\n".join(k.sample for k in KNOWN) * 40)[:MB]
    yield "state-dict-40k-keys", ("RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) in "
                                  "state_dict: " + ", ".join(f'"layer{i}.weight"' for i in range(40_000)))[:MB]


def generated_inputs(seed: int):
    """Random mixes of hostile fragments and known texts, up to 1 MB each."""
    rnd = random.Random(seed)
    samples = [k.sample for k in KNOWN]

    def fragment() -> str:
        kind = rnd.randrange(8)
        if kind == 0:
            return "9" * rnd.choice((50, 400, 5000, 50_000))
        if kind == 1:
            s = rnd.choice(samples)
            return re.sub(r"\d+", lambda m: "8" * rnd.choice((1, 30, 400, 4400)), s)
        if kind == 2:
            return "".join(chr(rnd.randrange(0, 0xA0)) for _ in range(rnd.randrange(1, 2000)))
        if kind == 3:
            return rnd.choice("([{<") * rnd.randrange(1, 100_000)
        if kind == 4:
            return rnd.choice(samples)
        if kind == 5:
            return rnd.choice((" ", "\t", "\n", "\r", ".", "_", "=", '"')) * rnd.randrange(1, 100_000)
        if kind == 6:
            return rnd.choice(("loss: nan ", "step 3 ", 'File "a.py", line 1, in f\n', "Traceback (most recent "
                               "call last):\n", "[rank0]: ", "\x1b[2K", "Tried to allocate ")) * rnd.randrange(1, 3000)
        return "".join(rnd.choice("ab cd\n") for _ in range(rnd.randrange(1, 50_000)))

    for i in range(10_000):
        parts, size, target = [], 0, rnd.choice((200, 5000, 100_000, MB))
        while size < target:
            f = fragment()
            parts.append(f)
            size += len(f)
        yield f"generated-{seed}-{i}", "".join(parts)[:target]


# ---------------------------------------------------------------- in-process: CPU per input


@pytest.mark.parametrize("name, text", list(fixed_inputs()), ids=[n for n, _ in fixed_inputs()])
def test_each_hostile_input_is_answered_in_under_a_second_of_cpu(name, text):
    for source in ("stdin", "args"):
        # this thread's CPU: process_time also counts the suite's background fixture lanes
        # (threads of this process reading their runs' output), which are not triage's cost.
        # The work is deterministic; the least of up to 3 tries is its cost: a fresh-clone CI run
        # read 1.06 s for `exception-lines`, which takes 0.56 s on the same box when its two cores
        # are not shared with the suite's fixture runs
        cpus = []
        for _ in range(3):
            t0 = time.thread_time()
            a = triage(text, source=source)
            cpus.append(time.thread_time() - t0)
            if cpus[-1] < CPU_LIMIT_S:
                break
        assert min(cpus) < CPU_LIMIT_S, (name, source, cpus)
        json.dumps(a.to_dict(), allow_nan=False)  # always serialisable, no inf/nan, no huge int


def test_a_400_digit_allocation_is_too_large_not_an_overflow():
    text = BY_ID["cuda-oom"].sample.replace("2.00 GiB", "9" * 400 + " GiB")
    a = triage(text, source="stdin")
    assert a.routes[0].skill == "tensor-operations-and-memory"
    assert "requested_bytes" in a.numbers["too_large"] and "requested_bytes" not in a.numbers
    assert a.numbers["capacity_bytes"] == round(79.11 * 2**30)  # the sane numbers are still read
    assert any("too large" in n for n in a.notes)


def test_a_long_question_reads_its_words_up_to_the_cap_and_says_so():
    a = triage("my loss goes nan " + "blah " * 10_000, source="args")
    assert a.routes[0].skill == "debugging-techniques"
    assert a.limits and "characters" in a.limits[0] and len(a.query) < 2100


def _quantified_atoms(pattern: str):
    """(atom, quantifier) for every quantifier in ``pattern`` (the subset of syntax the KB uses)."""
    i, n, prev = 0, len(pattern), None
    while i < n:
        c = pattern[i]
        if c == "\\":
            prev = pattern[i:i + 2]
            i += 2
            continue
        if c == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            prev = pattern[i:j + 1]
            i = j + 1
            continue
        if c in "+*":
            yield prev, c
        elif c == "{":
            j = pattern.index("}", i)
            yield prev, pattern[i:j + 1]
            i = j
        elif c == ")":
            prev = ")"
        elif c != "?":
            prev = c
        i += 1


@pytest.mark.parametrize("k", KNOWN, ids=[k.id for k in KNOWN])
def test_known_text_patterns_cannot_backtrack_without_bound(k):
    """Unbounded repeats only of digits, blanks or one literal character: a repeat that can run over
    the pattern's own start (a class, `.`, `\\w`, `\\S`, a group) is bounded, so every start costs
    a bounded amount and a scan stays linear however long the line."""
    for atom, q in _quantified_atoms(k.pattern):
        if q in ("+", "*") or q.endswith(",}"):
            assert atom in ("\\d", "\\s", " ") or (len(atom) == 1 and atom.isalnum()) or (
                len(atom) == 2 and atom[0] == "\\" and not atom[1].isalpha()), (k.id, atom, q)
        elif "," in q:
            assert int(q[1:-1].split(",")[1]) <= 300, (k.id, q)


# ---------------------------------------------------------------- the CLI: fuzzed for a bounded time


def _ask(args, data: bytes | None):
    """Run the CLI; returns (rc, stdout, stderr, cpu seconds of that process, peak RSS in MB)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "PYTHONIOENCODING": "utf-8"}
    p = subprocess.Popen([sys.executable, "-m", "torchdoctor", "ask", *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    out: dict = {}

    def feed():
        try:
            if data is not None:
                p.stdin.write(data)
            p.stdin.close()
        except BrokenPipeError:
            pass

    def drain(name, f):
        out[name] = f.read()

    threads = [threading.Thread(target=feed), threading.Thread(target=drain, args=("o", p.stdout)),
               threading.Thread(target=drain, args=("e", p.stderr))]
    for t in threads:
        t.start()
    _, status, ru = os.wait4(p.pid, 0)
    for t in threads:
        t.join(30)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out["o"], out["e"], ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def _check(name, rc, out: bytes, err: bytes, cpu: float):
    assert rc in (0, 1, 2), (name, rc, err[-1000:])
    assert b"Traceback" not in err and b"internal error" not in err, (name, err[-2000:])
    bad = _BAD_OUT.search(out.decode("utf-8", errors="replace"))
    assert bad is None, (name, repr(bad.group(0)), out[max(0, bad.start() - 80):bad.start() + 80])
    assert cpu < CPU_LIMIT_S + 0.5, (name, cpu)  # + the interpreter's and rich's start-up


FUZZ_BUDGET_S = float(os.environ.get("TORCHDOCTOR_FUZZ_SECONDS", "6"))  # longer: set the variable


def test_fuzz_the_cli_with_hostile_input_for_a_bounded_time():
    """Fixed shapes first, then generated mixes, on stdin (raw bytes, invalid UTF-8 included) and as
    words, console and --json, until the time budget is spent."""
    rnd = random.Random(1)
    cases = [(n, t) for n, t in fixed_inputs() if n in ("digits", "oom-400-digit-size", "control-bytes",
                                                        "escapes-in-error", "nested-parens", "huge-index")]
    deadline = time.monotonic() + FUZZ_BUDGET_S
    gen = generated_inputs(seed=14)
    n = 0
    while time.monotonic() < deadline or n < len(cases) + 4:
        name, text = cases[n] if n < len(cases) else next(gen)
        data = text.encode("utf-8", errors="surrogatepass")
        if rnd.random() < 0.3:  # invalid UTF-8 on stdin
            data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 3000))) + data
        extra = ["--json"] if n % 2 else []
        if n % 3 == 2 and "\x00" not in text:  # as words (argv cannot hold NUL; 100 KB per word)
            words = [text[i:i + 100_000] for i in range(0, min(len(text), 900_000), 100_000)] or ["x"]
            words = [w if not w.startswith("-") else " " + w for w in words]
            rc, out, err, cpu, _ = _ask([*extra, "--", *words], None)
        else:
            rc, out, err, cpu, _ = _ask(["-", *extra], data)
        _check(name, rc, out, err, cpu)
        if extra and rc == 0:
            json.loads(out)
        n += 1


# ---------------------------------------------------------------- stdin: bounded reading


def test_an_endless_stdin_is_answered_with_bounded_memory(tmp_path):
    """`yes ... | torchdoctor ask -` used to grow without limit (10 GB in 10 s)."""
    yes = shutil.which("yes")
    if yes is None:
        pytest.skip("no `yes` here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    w = subprocess.Popen([yes, "step 1 loss: 1.0 lr 0.1"], stdout=subprocess.PIPE)
    t0 = time.monotonic()
    # peak RSS from VmHWM at exit: ru_maxrss would carry the (large) pytest process's RSS at fork
    hwm = tmp_path / "vmhwm"
    boot = ("import atexit, re, runpy, sys\n"
            f"atexit.register(lambda: open({str(hwm)!r}, 'w').write(re.search("
            "r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))\n"
            "sys.argv = ['torchdoctor'] + sys.argv[1:]\n"
            "runpy.run_module('torchdoctor', run_name='__main__')\n")
    p = subprocess.Popen([sys.executable, "-c", boot, "ask", "-", "--json"], stdin=w.stdout,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    w.stdout.close()
    try:
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
    finally:
        w.kill()
        w.wait()
    assert os.waitstatus_to_exitcode(status) == 0 and time.monotonic() - t0 < 60
    assert int(hwm.read_text()) / 1024 < 300, hwm.read_text()
    limits = json.loads(out)["input"]["limits"]
    assert any("stopped reading" in x for x in limits) and any("first 1.0 MiB" in x for x in limits)


def test_an_open_stdin_that_goes_quiet_is_answered():
    """`tail -f train.log | torchdoctor ask -` never answered: now after 2 s without new input."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    w = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                          "print('epoch 1 step 10 loss 0.52')\n"
                          "print('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB.', flush=True)\n"
                          "time.sleep(120)"], stdout=subprocess.PIPE)
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "torchdoctor", "ask", "-", "--json"], stdin=w.stdout,
                           capture_output=True, env=env, cwd=ROOT, timeout=60)
    finally:
        w.kill()
        w.wait()
    assert r.returncode == 0 and time.monotonic() - t0 < 30
    d = json.loads(r.stdout)
    assert d["decisive_line"]["id"] == "cuda-oom" and d["decisive_line"]["line"] == 2
    assert any("still open" in x for x in d["input"]["limits"])


def test_a_big_log_keeps_its_end_and_its_line_numbers(tmp_path, cli):
    """Errors are at the end of a log: a 20 MB log, from a file and through a pipe."""
    log = tmp_path / "train.log"
    with open(log, "w") as f:
        for i in range(400_000):
            f.write(f"epoch 0 step {i} loss 0.4321 lr 0.001 grad_norm 1.23\n")
        f.write("RuntimeError: CUDA out of memory. Tried to allocate 1.50 GiB.\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for how in ("file", "pipe"):
        with open(log, "rb") as f:
            if how == "file":
                r = subprocess.run([sys.executable, "-m", "torchdoctor", "ask", "-", "--json"], stdin=f,
                                   capture_output=True, env=env, cwd=ROOT, timeout=120)
            else:
                r = subprocess.run([sys.executable, "-m", "torchdoctor", "ask", "-", "--json"], input=f.read(),
                                   capture_output=True, env=env, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr[-500:]
        d = json.loads(r.stdout)
        assert d["decisive_line"]["line"] == 400_001 and d["input"]["lines"] == 400_001, how
        assert "not read" in d["input"]["limits"][0], how


# in-process: the reader's bounds, with small constants so the test is fast


@pytest.fixture
def small_bounds(monkeypatch):
    from torchdoctor.triage import stdin

    monkeypatch.setattr(stdin, "HEAD_BYTES", 4096)
    monkeypatch.setattr(stdin, "TAIL_BYTES", 2048)
    monkeypatch.setattr(stdin, "QUIET_S", 0.3)
    monkeypatch.setattr(stdin, "WAIT_S", 1.0)
    monkeypatch.setattr(stdin, "READ_MAX", 1 << 20)
    return stdin


def _pipe_writer(lines, gap_s=0.0, then_sleep=0.0):
    r, w = os.pipe()

    def write():
        try:
            with os.fdopen(w, "wb", buffering=0) as f:
                for ln in lines:
                    f.write(ln)
                    if gap_s:
                        time.sleep(gap_s)
                time.sleep(then_sleep)
        except OSError:  # the reader stopped reading and closed its end
            pass

    threading.Thread(target=write, daemon=True).start()
    return r


def test_reader_keeps_head_and_tail_and_counts_the_gap(small_bounds):
    lines = [f"line {i}\n".encode() for i in range(5000)]
    fd = _pipe_writer(lines)
    try:
        got = small_bounds.read_stdin_bounded(fd)
    finally:
        os.close(fd)
    assert got.text.startswith("line 0\n") and got.text.endswith("line 4999\n")
    g, skipped = got.gap
    kept = got.text.split("\n")
    assert kept[g].startswith("[torchdoctor:") and kept[g + 1] == f"line {g + skipped}"
    assert len(got.text) < 4096 + 2048 + 200


def test_reader_stops_on_a_stream_that_keeps_coming(small_bounds):
    fd = _pipe_writer([b"step loss 1.0\n"] * 1000, gap_s=0.05)
    t0 = time.monotonic()
    try:
        got = small_bounds.read_stdin_bounded(fd)
    finally:
        os.close(fd)
    assert 0.9 < time.monotonic() - t0 < 5 and any("kept coming" in x for x in got.limits)


def test_reader_blocks_on_a_terminal_until_the_end(small_bounds):
    """A person pasting: no quiet-period answer, only end of input (Ctrl-D)."""
    fd = _pipe_writer([b"RuntimeError: boom\n", b"more\n"], gap_s=0.6)
    try:
        got = small_bounds.read_stdin_bounded(fd, tty=True)
    finally:
        os.close(fd)
    assert got.text == "RuntimeError: boom\nmore\n" and not got.limits


def test_the_route_drawn_in_a_probe_report_escapes_the_pasted_text():
    """`ask - --run`: the query and why quote the log; the probe's console report draws them."""
    from torchdoctor.findings import Report
    from torchdoctor.report.console import render_to_text

    a = triage("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB \x9b2J [/x] \u202eevil\x07",
               source="args")
    a.script = "train.py"
    rep = Report(command="memory", target="train.py", metrics={"route": a.route_for_run()})
    text = render_to_text(rep)
    assert "Route: tensor-operations-and-memory" in text and "[/x]" in text
    assert "\\x9b" in text and "\\u202e" in text and "\\x07" in text
    assert _BAD_OUT.search(text) is None


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_words_that_are_not_utf8_do_not_crash_a_strict_stdout(extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "ask", b"\xff\xfe loss goes nan", *extra],
                       capture_output=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr[-500:]
    assert "debugging-techniques" in r.stdout.decode("utf-8")  # valid UTF-8 throughout
