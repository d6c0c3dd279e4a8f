"""`torchdoctor ask`: output, JSON contract, stdin, exit codes (in this process: conftest
run_main, the same entry point), and as a fresh process what is about the process: imports,
speed, broken pipes, the hand-off to a probe's run."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, ROOT
from test_ask_logscan import make_training_log

FIX = FIXTURES / "ask"
CONTRACT_KEYS = {"tool", "version", "schema", "command", "query", "clarify", "routes", "recognized"}


def test_console_answer_shows_route_why_steps_and_next(cli_inproc):
    r = cli_inproc("ask", "my loss goes nan after a while")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "debugging-techniques" in out and "torchdoctor nan SCRIPT" in out
    assert "why:" in out and '"nan"' in out and "1." in out and "Next: torchdoctor nan SCRIPT" in out


def test_json_follows_the_contract(cli_inproc):
    r = cli_inproc("ask", "CUDA out of memory with DDP on 8 GPUs", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # nothing but one JSON object on stdout
    assert CONTRACT_KEYS <= set(d)
    assert (d["tool"], d["schema"], d["command"], d["clarify"]) == ("torchdoctor", 1, "ask", None)
    assert d["query"] == "CUDA out of memory with DDP on 8 GPUs"
    assert [x["skill"] for x in d["routes"]] == ["distributed-training-strategies", "tensor-operations-and-memory"]
    for route in d["routes"]:
        assert {"skill", "why", "probe", "steps"} <= set(route)
        assert route["why"] and route["steps"] and all(isinstance(s, str) for s in route["steps"])
    assert all({"pattern", "skill"} <= set(x) for x in d["recognized"])
    assert d["next"] == "torchdoctor dist [SCRIPT]"


def test_ambiguous_query_json_has_one_question_and_no_route(cli_inproc):
    d = json.loads(cli_inproc("ask", "optimize", "my", "model", "--json").stdout)
    assert d["routes"] == [] and d["clarify"] == "Optimize what? Training speed? Memory usage? Inference?"


def test_stdin_10k_line_log_answered_under_a_second_with_the_decisive_line(cli):
    log = make_training_log(oom=True)
    best = None
    for _ in range(3):  # best of three: the box is shared; one run is enough when it is quiet
        t0 = time.perf_counter()
        r = cli("ask", "-", "--json", input=log)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
        if best < 1.0:
            break
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["decisive_line"]["line"] == 10_000 and "CUDA out of memory" in d["decisive_line"]["text"]
    assert d["numbers"]["requested_bytes"] == round(1.5 * 2**30)
    assert d["input"] == {"source": "stdin", "mode": "log", "lines": 10_000, "limits": []}
    assert best < 1.0, best


def test_stdin_console_quotes_the_decisive_line(cli_inproc):
    r = cli_inproc("ask", "-", input=make_training_log(nan_at=321, n=2000))
    assert r.returncode == 0, r.stderr
    assert "line 321 of 2000" in r.stdout and "step 321 loss nan" in r.stdout


@pytest.mark.parametrize("args, stdin, message", [
    ((), None, "missing SYMPTOM"),
    (("--jsn", "x"), None, "did you mean --json"),
    (("-", "loss", "nan"), "x", "not both"),
    (("slow", "--run"), None, "--run needs a SCRIPT"),
    (("-",), "   \n", "nothing on stdin"),
    (("fix my training", "--run", "train.py"), None, "no route to run yet"),
])
def test_bad_usage_exits_2_with_one_clear_line(cli_inproc, args, stdin, message):
    r = cli_inproc("ask", *args, input=stdin)  # in-process, any run forbidden (conftest)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr + r.stdout


def _probes_ready(command: str) -> bool:
    return bool(importlib.util.find_spec("torchdoctor.pipeline.run")
                and importlib.util.find_spec(f"torchdoctor.commands.{command}"))


def test_run_hands_off_to_the_first_routes_probe(cli, tmp_path):
    """`ask ... --run PATH`: the probe's own report and exit code, with the route in it."""
    junk = tmp_path / "last.pt"
    junk.write_text("not a checkpoint")
    r = cli("ask", "resume from checkpoint", "--json", "--run", str(junk))
    assert "Traceback" not in r.stderr
    d = json.loads(r.stdout)
    assert d["metrics"]["route"]["skill"] == "checkpointing-and-reproducibility"
    assert d["command"] == "checkpoint-audit" and d["target"] == str(junk)
    assert r.returncode == 1 and any(f["code"] == "ckpt-unreadable" for f in d["findings"])


def test_run_json_keeps_the_route_its_why_and_the_playbook(cli, tmp_path):
    """`ask --json --run`: one JSON document, the probe's report, with ask's route in full."""
    junk = tmp_path / "last.pt"
    junk.write_text("not a checkpoint")
    r = cli("ask", "resume from checkpoint on 2 GPUs", "--json", "--run", str(junk))
    d = json.loads(r.stdout)  # one document
    route = d["metrics"]["route"]
    asked = json.loads(cli("ask", "resume from checkpoint on 2 GPUs", "--json").stdout)
    first = asked["routes"][0]
    assert route["skill"] == first["skill"] and route["why"] == first["why"] and route["why"]
    assert route["steps"] == first["steps"] and route["steps_detail"] == first["steps_detail"]
    assert route["probe"] == f"torchdoctor checkpoint-audit {junk}"  # SCRIPT/PATH filled in
    assert [t["skill"] for t in route["then"]] == [x["skill"] for x in asked["routes"][1:]]
    assert all(t["why"] and t["steps"] for t in route["then"])
    assert route["recognized"] == asked["recognized"] and route["query"] == asked["query"]


def test_run_finds_the_script_after_the_probes_own_options():
    from torchdoctor.triage.handoff import script_of
    from torchdoctor.triage.symptoms import CKPT, PERF

    assert script_of(PERF, ["--steps", "3", "--json", "train.py", "--lr", "1"]) == "train.py"
    assert script_of(PERF, ["--timeout=30", "-m", "pkg.train", "--epochs", "1"]) == "-m pkg.train"
    assert script_of(PERF, ["train.py", "--steps", "3"]) == "train.py"
    assert script_of(CKPT, ["last.pt"]) == "last.pt"


@pytest.mark.slow
def test_run_profiles_a_script(cli, tmp_path):
    if not _probes_ready("profile"):
        pytest.skip("script probes not built")
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(8, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(5):\n    loss = m(torch.randn(4, 8)).pow(2).mean()\n"
                      "    opt.zero_grad(); loss.backward(); opt.step()\n")
    r = cli("ask", "training is slow", "--json", "--run", "--steps", "3", str(script), timeout=600)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["command"] == "profile" and d["metrics"]["route"]["skill"] == "performance-profiling"
    assert d["metrics"]["run"]["steps"] == 3  # the probe's option, given before SCRIPT
    route = d["metrics"]["route"]
    assert route["why"] and route["steps"] and route["probe"] == f"torchdoctor profile {script}"
    assert route["after"] == f"torchdoctor treat {script}"  # offered after the measurement
    flops = d["metrics"]["flops"]  # 3 steps: the profiler window takes them all; no figure, the reason
    assert flops["status"] == "skipped" and "profiler window" in flops["reason"] and "mfu" not in flops


def test_words_starting_with_a_dash_are_words(cli):
    d = json.loads(cli("ask", "loss", "is", "-inf", "--json").stdout)
    assert d["routes"][0]["skill"] == "debugging-techniques"


def test_help_goes_through_typer(cli):
    r = cli("ask", "--help")
    assert r.returncode == 0 and "--run" in r.stdout and "stdin" in r.stdout


def test_ask_imports_neither_torch_nor_typer():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, stdin in ((["ask", "my", "ddp", "job", "hangs"], None), (["ask", "-", "--json"], "x\n" * 10)):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchdoctor", *args], input=stdin,
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr[-500:]
        mods = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
        heavy = sorted(m for m in mods if m.split(".")[0] in ("torch", "typer", "click", "psutil", "pynvml",
                                                              "numpy"))
        assert heavy == [], heavy


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_broken_pipe_is_not_an_error(extra):
    """`torchdoctor ask - < log | head -c 100`: the reader leaves early; ask exits 0, no traceback."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("cannot shrink a pipe here")
    log = (FIX / "torchrun_oom.log").read_bytes()  # two routes: an answer larger than the pipe
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    rfd, wfd = os.pipe()
    fcntl.fcntl(wfd, fcntl.F_SETPIPE_SZ, 4096)  # the writer must block before it is done
    p = subprocess.Popen([sys.executable, "-m", "torchdoctor", "ask", "-", *extra], stdin=subprocess.PIPE,
                         stdout=wfd, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    os.close(wfd)
    p.stdin.write(log)
    p.stdin.close()
    with os.fdopen(rfd, "rb") as r:
        assert r.read(100)
    assert p.wait(timeout=60) == 0
    assert b"Traceback" not in p.stderr.read()


def test_parser_keeps_everything_after_run_script_for_the_script():
    from torchdoctor.triage.cli_fast import parse

    a = parse(["loss", "is", "nan", "--json", "--run", "train.py", "--lr", "3", "--json", "-"])
    assert a.words == ["loss", "is", "nan"] and a.as_json and not a.stdin
    assert a.run == ["train.py", "--lr", "3", "--json", "-"]
    a = parse(["--", "--weird", "words"])
    assert a.words == ["--weird", "words"] and a.run is None
    assert parse(["-", "--json"]).stdin
    a = parse(["slow", "--run", "-m", "pkg.train", "--epochs", "1"])
    assert a.run == ["-m", "pkg.train", "--epochs", "1"]


def test_help_after_run_belongs_to_the_script():
    from torchdoctor.main import _asks_for_help

    assert _asks_for_help(["slow", "--help"])
    assert not _asks_for_help(["slow", "--run", "train.py", "-h"])
