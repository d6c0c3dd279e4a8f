"""Parent side of a ranked run: the harness on every rank through torchrun (never imports torch).

:class:`RankSet` is what :func:`torchdoctor.runner.launch.launch` needs to run the child harness
under ``python -m torch.distributed.run --standalone --nproc-per-node N --no-python python -c
BOOT ...`` (PyTorch's own launcher) instead of as one child:

* ``command`` / ``env``: the torchrun command line; the environment minus stale launch
  variables, plus ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (NVLink
  multicast is never used), the Flight Recorder (:func:`flight_env`: a buffer, a dump pipe and
  a dump file in the run dir, each only where the user set none), and the marker that makes
  each rank use its own run dir ``D/rank{R}`` (see :mod:`torchdoctor.distributed.rankdir`);
* ``request_dumps`` at the timeout: ``dump.request`` in every rank dir (the collective
  recorder's watcher thread writes the flight recorder), one line to every rank's Flight
  Recorder pipe (NCCL's watchdog writes the dump, even when the rank's Python cannot run) and
  SIGUSR1 to every rank (its faulthandler writes every thread's stack), not to torchrun;
* ``kill``: SIGKILL to every rank's process group (torchrun starts each rank in its own
  session, so killing torchrun's group does not reach them) and to torchrun's children;
* ``finish``: every rank's ``result.json`` completed with what only the parent knows (the
  timeout, torchrun's per-rank exit codes), and the merged top-level result.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from torchdoctor.distributed import frpipe
from torchdoctor.distributed.failtext import own_crash
from torchdoctor.distributed.procs import live_cmdline
from torchdoctor.distributed.rankdir import (DUMP_DONE, DUMP_REQUEST, FR_DUMP_STEM, FR_PIPE_STEM, PID,
                                             RANKED_ENV, rank_dir)
from torchdoctor.runner.rundir import EVENTS, RESULT, read_json, write_json

# Never let anything we launch on GPUs use NVLink multicast (NVLS / symmetric memory).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# Flight Recorder entries kept per process group: torch 2.13's own default (FlightRecorder.hpp),
# the size PyTorch's Flight Recorder tutorial recommends; set under both names (2.11 and 2.13)
FR_BUFFER = "2000"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DUMP_WAIT_MAX_S = 4.0  # at the timeout: wait this long at most for the ranks' dumps
DUMP_WAIT_MIN_S = 1.0  # and at least this long (faulthandler writes from a signal handler)
# torchrun's own console lines that say nothing about the script
QUIET_PATTERNS = [r"^\*{20,}\s*$",
                  r"^Setting OMP_NUM_THREADS environment variable for each process"]
# torch >= 2.12 warns about the older flight-recorder variables we set for torch < 2.12
FR_OLD_NAMES = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_DEPRECATION = r"Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated"


def flight_env(env: dict[str, str], run_dir: str | os.PathLike) -> dict[str, str]:
    """The Flight Recorder variables to add for a launch: a buffer of FR_BUFFER entries, the dump
    pipe and the dump file in the run dir. Each only where the user set none of its names (a
    user's ``TORCH_FR_BUFFER_SIZE=0`` stays off; their own pipe or dump path stays theirs)."""
    out: dict[str, str] = {}
    if not any(k in env for k in frpipe.BUFFER_KEYS):
        out.update({k: FR_BUFFER for k in frpipe.BUFFER_KEYS})
    if frpipe.PIPE_KEY not in env:
        out[frpipe.PIPE_KEY] = str(Path(run_dir) / FR_PIPE_STEM)
    if not any(k in env for k in frpipe.DUMP_KEYS):
        out.update({k: str(Path(run_dir) / FR_DUMP_STEM) for k in frpipe.DUMP_KEYS})
    return out


def quiet_patterns(env: dict[str, str]) -> list[str]:
    """Lines to drop from the ranks' output: torchrun's banner, and the deprecation warnings of
    the older flight-recorder variables unless the user set them."""
    return QUIET_PATTERNS + [FR_DEPRECATION.replace(FR_OLD_NAMES[0], k) for k in FR_OLD_NAMES
                             if k not in env]
_FAIL_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)(?:\s*\(local_rank\s*:\s*(\d+)\))?")
_FAIL_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def parse_failures(lines: list[str], local: bool = False) -> dict[int, dict[str, Any]]:
    """torchrun's failure summary -> {rank: {"exitcode": int, "root_cause": bool}}.

    The summary lists ``rank : R (local_rank: L)`` then ``exitcode : -15 (pid: P)``; the
    block after ``Root Cause (first observed failure):`` names the rank that failed first.
    ``local``: key by the local rank L (a node of a multi-node job knows its ranks by L).
    """
    out: dict[int, dict[str, Any]] = {}
    root = False
    rank = None
    for line in lines:
        if "Root Cause" in line:
            root = True
        m = _FAIL_RANK.match(line)
        if m:
            rank = int(m.group(2)) if local and m.group(2) is not None else int(m.group(1))
            continue
        m = _FAIL_EXIT.match(line)
        if m and rank is not None:
            out.setdefault(rank, {})["exitcode"] = int(m.group(1))
            out[rank]["root_cause"] = out[rank].get("root_cause", False) or root
            rank = None
    return out


def _count_steps(events: Path) -> int:
    try:
        with open(events, "rb") as f:
            return sum(1 for line in f if b'"kind": "step"' in line)
    except OSError:
        return 0


def merged_outcome(ranks: list[dict[str, Any]], timed_out: bool) -> dict[str, Any]:
    """The run's outcome from the ranks': a hang, else the first real failure, else success.

    A rank stopped by torchrun because another rank failed is not a failure of its own.
    """
    if timed_out:
        return {"outcome": "timeout"}
    own = [r for r in ranks if not r.get("stopped_by_launcher")]
    first_own = [r for r in own if own_crash(r)]  # raised in its own code: the others followed
    if first_own:
        out = {"outcome": "crash", "failed_rank": first_own[0].get("rank")}
        if first_own[0].get("exit_code") is not None:
            out["exit_code"] = first_own[0]["exit_code"]
        return out
    for kind in ("crash", "signal", "interrupted"):
        hit = [r for r in own if r.get("outcome") == kind]
        if hit:
            first = hit[0]
            out = {"outcome": kind, "failed_rank": first.get("rank")}
            for k in ("signal", "signum", "exit_code"):
                if first.get(k) is not None:
                    out[k] = first[k]
            return out
    bad = [r for r in own if r.get("outcome") == "exit" and r.get("exit_code") not in (0, None)]
    if bad:
        return {"outcome": "exit", "exit_code": bad[0]["exit_code"], "failed_rank": bad[0].get("rank")}
    if any(r.get("outcome") == "stopped" for r in ranks):
        return {"outcome": "stopped", "exit_code": 0}
    return {"outcome": "exit", "exit_code": 0}


class RankSet:
    """The ranks of one launch (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike, nproc: int, node: Any = None):
        self.run_dir = Path(run_dir)
        self.nproc = int(nproc)
        # a multi-node launch (distributed/multinode.py NodeSpec): rank dirs by local rank
        self.node = node
        self.torchrun_pid: int | None = None
        self.dump_requested_at: float | None = None
        self.alive_at_request: set[int] = set()
        self.fr_set: dict[str, str] = {}  # the Flight Recorder variables this launch added
        self.fr_pipe: str | None = None  # the pipe stem the ranks were given (theirs or ours)
        self.fr_poked: dict[str, str] = {}  # pipe → "written" / why not, at the dump request
        self.fr_expect: list[Path] = []  # dumps NCCL should write after a poke (in our run dir)

    # ------------------------------------------------------------------ launch
    def command(self, boot: list[str]) -> list[str]:
        """torchrun running ``boot`` (the harness command line, python first) on every rank."""
        where = self.node.torchrun_args() if self.node is not None else ["--standalone"]
        return [sys.executable, "-m", "torch.distributed.run", *where,
                f"--nproc-per-node={self.nproc}", "--max-restarts=0", "--monitor-interval=0.1",
                "--no-python", *boot]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        env = dict(env)
        for k in list(env):
            if k in LAUNCH_VARS or k.startswith("TORCHELASTIC_"):
                del env[k]
        env.update(SAFE_ENV)
        self.fr_set = flight_env(env, self.run_dir)
        env.update(self.fr_set)
        self.fr_pipe = env.get(frpipe.PIPE_KEY) or None
        env[RANKED_ENV] = "1"
        if self.node is not None:
            from torchdoctor.distributed.multinode import NODE_ENV

            env[NODE_ENV] = str(self.node.node_rank)
        return env

    def started(self, pid: int) -> None:
        self.torchrun_pid = pid

    def events_path(self) -> Path:
        """Progress is read from rank 0."""
        return rank_dir(self.run_dir, 0) / EVENTS

    def results_written(self) -> bool:
        return all((rank_dir(self.run_dir, r) / RESULT).exists() for r in range(self.nproc))

    # ------------------------------------------------------------------ processes
    def pids(self) -> dict[int, int]:
        """{rank: pid} of the rank processes still alive (checked against their command line)."""
        out = {}
        for r in range(self.nproc):
            try:
                pid = int((rank_dir(self.run_dir, r) / PID).read_text().strip())
            except (OSError, ValueError):
                continue
            if self._ours(pid):
                out[r] = pid
        return out

    def _ours(self, pid: int) -> bool:
        args = live_cmdline(pid)
        return args is not None and any(str(self.run_dir) in a for a in args)

    def _launcher_children(self) -> list[int]:
        if not self.torchrun_pid:
            return []
        try:
            import psutil

            return [c.pid for c in psutil.Process(self.torchrun_pid).children(recursive=False)]
        except Exception:  # noqa: BLE001 - torchrun gone already
            return []

    def signal_ranks(self, sig: int) -> None:
        for pid in self.pids().values():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def request_dumps(self) -> None:
        """At the timeout: flight recorder (watcher thread) and stacks (SIGUSR1) of every rank."""
        self.dump_requested_at = time.monotonic()
        self.note_alive()
        for r in range(self.nproc):
            d = rank_dir(self.run_dir, r)
            if d.is_dir():
                try:
                    (d / DUMP_REQUEST).touch()
                except OSError:
                    pass
        self.poke_flight_recorders()
        self.signal_ranks(signal.SIGUSR1)

    def poke_flight_recorders(self) -> None:
        """One line to every NCCL rank's dump pipe (a gloo rank has none: nothing to do)."""
        if not self.fr_pipe:
            return
        for r in self.pids():
            g = self.label(r)
            pipe = frpipe.pipe_path(self.fr_pipe, g if g is not None else r)
            if os.path.exists(pipe):
                self.fr_poked[pipe] = frpipe.poke(pipe) or "written"
                if self.fr_poked[pipe] == "written" and frpipe.DUMP_KEYS[0] in self.fr_set:
                    self.fr_expect.append(self.run_dir / f"{FR_DUMP_STEM}{g if g is not None else r}")

    def flight_recorder(self) -> dict[str, Any]:
        """What the report says of the Flight Recorder of this launch."""
        out: dict[str, Any] = {"set": dict(self.fr_set), "pipe": self.fr_pipe}
        if self.fr_poked:
            out["poked"] = dict(self.fr_poked)
        return out

    def remove_pipes(self) -> None:
        """The ranks' dump pipes that torch made in our run dir (it never removes them)."""
        if frpipe.PIPE_KEY not in self.fr_set:
            return
        for p in self.run_dir.glob(f"{FR_PIPE_STEM}*.pipe"):
            try:
                if p.is_fifo():
                    p.unlink()
            except OSError:
                pass

    def dumps_done(self) -> bool:
        """True once every live rank served the request (and NCCL wrote the dump each poked pipe
        asked for), or DUMP_WAIT_MAX_S passed."""
        if self.dump_requested_at is None:
            return True
        waited = time.monotonic() - self.dump_requested_at
        if waited < DUMP_WAIT_MIN_S:
            return False
        if waited >= DUMP_WAIT_MAX_S:
            return True
        return (all((rank_dir(self.run_dir, r) / DUMP_DONE).exists() for r in self.pids())
                and all(p.exists() for p in self.fr_expect))  # NCCL's watchdog dumps in ~1 s

    def interrupt(self) -> None:
        """Ctrl-C: stacks and flight recorder first (a rank blocked in a collective never sees
        the KeyboardInterrupt and is killed after the grace period), then SIGINT to every rank."""
        self.request_dumps()
        self.signal_ranks(signal.SIGINT)

    def kill(self) -> bool:
        """SIGKILL every rank (its whole process group: DataLoader workers too); True if none is left."""
        targets = set(self.pids().values()) | set(self._launcher_children())
        for pid in targets:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if not self.pids():
                return True
            time.sleep(0.05)
        return not self.pids()

    # ------------------------------------------------------------------ results
    def finish(self, top: dict[str, Any]) -> dict[str, Any]:
        """Complete each rank's result.json; return the merged top-level result.

        ``top`` is what the launcher knows: outcome (``timeout`` or torchrun's exit),
        ``timeout_s``, ``returncode``, ``wall_s``, ``output_tail``.
        """
        timed_out = top.get("outcome") == "timeout"
        interrupted = bool(top.get("interrupted"))
        failures = parse_failures(top.get("output_tail") or [], local=self.node is not None)
        roots = {r for r, f in failures.items() if f.get("root_cause")}
        ranks: list[dict[str, Any]] = []
        for r in range(self.nproc):
            d = rank_dir(self.run_dir, r)
            res = read_json(d / RESULT) or {}
            if "outcome" not in res:
                res = {**res, **self._missing_result(r, timed_out, top, failures, roots)}
                if interrupted and not timed_out and r in self.alive_at_request:
                    res.update(outcome="interrupted", killed=True)  # blocked past Ctrl-C's grace
            elif res.get("outcome") in ("exit", "stopped") and timed_out and r in self.alive_at_request:
                res = {**res, "outcome": "timeout", "timeout_s": top.get("timeout_s"),
                       "child_outcome": res.get("outcome")}
            res["rank"] = self.label(r)
            if self.node is not None:
                res["local_rank"] = r
            if res.get("steps") is None:  # killed before it could say: count its step events
                res["steps"] = _count_steps(d / EVENTS)
            if d.is_dir():
                write_json(d / RESULT, res)
            ranks.append(res)
        merged = {k: v for k, v in top.items() if k not in ("outcome", "exit_code", "no_result",
                                                             "signal", "signum")}
        merged.update(merged_outcome(ranks, timed_out))
        if interrupted:
            merged["interrupted"] = True
        merged["launcher_returncode"] = top.get("returncode")
        merged["flight_recorder"] = self.flight_recorder()
        self.remove_pipes()
        merged["ranks"] = [{k: v for k, v in res.items() if k in (
            "rank", "local_rank", "outcome", "exit_code", "signal", "steps", "stopped_by_launcher",
            "reason")}
            for res in ranks]
        merged["steps"] = min((int(res.get("steps") or 0) for res in ranks), default=0)
        return merged

    def label(self, r: int) -> int | None:
        """The global rank of local rank ``r`` (one node of a multi-node job: the rank says)."""
        if self.node is None:
            return r
        meta = read_json(rank_dir(self.run_dir, r) / "meta.json") or {}
        return meta["rank"] if isinstance(meta.get("rank"), int) else None  # never started

    def note_alive(self) -> None:
        """Remember which ranks were still running when the dumps were asked for (timeout, Ctrl-C)."""
        self.alive_at_request = set(self.pids())

    def _missing_result(self, r: int, timed_out: bool, top: dict[str, Any],
                        failures: dict[int, dict[str, Any]], roots: set[int]) -> dict[str, Any]:
        d = rank_dir(self.run_dir, r)
        if not d.is_dir():
            return {"outcome": "not_started", "no_result": True}
        if timed_out:
            return {"outcome": "timeout", "timeout_s": top.get("timeout_s")}
        f = failures.get(r)
        if f and f.get("exitcode", 0) < 0:
            signum = -int(f["exitcode"])
            out: dict[str, Any] = {"outcome": "signal", "signal": signal_name(signum),
                                   "signum": signum}
            if signum in (signal.SIGTERM, signal.SIGKILL) and roots and r not in roots:
                out["stopped_by_launcher"] = True  # torchrun ended it after another rank failed
            return out
        if f:
            return {"outcome": "exit", "exit_code": f.get("exitcode"), "no_result": True}
        return {"outcome": "exit", "exit_code": None, "no_result": True}
