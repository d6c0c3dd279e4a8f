"""Multi-node attach on one box: one gloo job of two "nodes" (two torchrun agents, one rank each,
c10d rendezvous on 127.0.0.1), hung by design (skip_allreduce.py: rank 1 skips an all_reduce);
`torchdoctor attach --job LAUNCHER --nnodes 2 --node-rank K --rdzv-endpoint ...` on each "node"
at once. Node 0 prints one job report naming both ranks with their nodes; node 1 says where the
report is. Then node 0 alone: node 1 never arrives and is named within --timeout. The job is
still running after every attach (the test ends it). Skipped where py-spy or ptrace is missing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_attach import FIXTURES, START_TIMEOUT_S, kill_tree, pyspy  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodeJob:
    def __init__(self, script: str, env: dict, port: int) -> None:
        self.lines: list[str] = []
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "td-e2e",
             str(FIXTURES / script)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", **env}) for _ in range(2)]
        for p in self.procs:
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p: subprocess.Popen) -> None:
        for line in p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, *texts: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(any(t in ln for ln in self.lines) for t in texts):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"job did not print {texts}: {self.lines[-20:]}")

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def kill(self) -> None:
        for p in self.procs:
            kill_tree(p)


def attach_node(launcher: int, k: int, port: int, gather: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchdoctor", "attach", "--job", str(launcher), "--nnodes", "2",
         "--node-rank", str(k), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "att", *extra, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TORCHDOCTOR_GATHER_PORT": str(gather)})


def report_of(p: subprocess.Popen) -> tuple[int, dict | None, str]:
    out, err = p.communicate(timeout=240)
    try:
        return p.returncode, json.loads(out) if out.strip() else None, err
    except ValueError:
        return p.returncode, None, err + out[-2000:]


def test_two_nodes_attach_and_node_0_prints_one_job_report_then_names_a_node_that_never_came(pyspy, tmp_path):
    stop = tmp_path / "stop"
    port, gather = free_port(), free_port()
    job = TwoNodeJob("skip_allreduce.py", {"STOP_FILE": str(stop)}, port)
    try:
        job.wait_for("rank 0 training", "rank 1 training")
        stop.touch()  # rank 1 skips the all_reduce: rank 0 waits in it, rank 1 in the barrier
        job.wait_for("rank 1 skips the all_reduce")
        time.sleep(1)  # both reach the place where they hang
        # both nodes at once, each on its own launcher (node 1 starts first: it retries until node 0 listens)
        n1 = attach_node(job.procs[1].pid, 1, port, gather, "--duration", "3")
        n0 = attach_node(job.procs[0].pid, 0, port, gather, "--duration", "3")
        code0, rep0, err0 = report_of(n0)
        code1, rep1, err1 = report_of(n1)
        assert rep0 is not None, (code0, err0[-3000:])
        assert rep1 is not None, (code1, err1[-3000:])
        if os.environ.get("OUT"):  # the two nodes' reports, for a look
            for k, rep in ((0, rep0), (1, rep1)):
                Path(os.environ["OUT"], f"attach_node{k}.json").write_text(json.dumps(rep, indent=1))
        att = rep0["metrics"]["attach"]
        assert sorted(p["rank"] for p in att["processes"] if p["role"] == "rank") == [0, 1]
        assert [n["reported"] for n in att["nodes"]] == [True, True]
        assert rep0["metrics"]["job"]["reported"] == [0, 1]
        codes = {f["code"] for f in rep0["findings"]}
        assert codes & {"collective-mismatch", "collective-hang"}, rep0["findings"]
        hang = next(f for f in rep0["findings"] if f["code"] in ("collective-mismatch", "collective-hang"))
        assert "(node " in hang["title"] and "skip_allreduce.py" in hang["title"]
        assert not {"node-lost", "node-summary-invalid"} & codes
        assert code0 == 1  # an error finding; --fail-on error
        assert rep1["metrics"]["node"]["sent"] is True and rep1["metrics"]["node"]["node_rank"] == 1
        assert job.running()  # attach never ends or signals the job

        # node 0 alone: node 1 is named within --timeout
        t0 = time.monotonic()
        alone = attach_node(job.procs[0].pid, 0, port, gather, "--duration", "2", "--timeout", "12")
        code, rep, err = report_of(alone)
        took = time.monotonic() - t0
        assert rep is not None, (code, err[-3000:])
        lost = [f for f in rep["findings"] if f["code"] == "node-lost"]
        assert len(lost) == 1 and lost[0]["title"].startswith("node 1 sent no report"), rep["findings"]
        assert [n["reported"] for n in rep["metrics"]["attach"]["nodes"]] == [True, False]
        assert took < 12 + 30, took  # the bound, plus the process's own start-up on a loaded box
        assert job.running()
    finally:
        job.kill()
