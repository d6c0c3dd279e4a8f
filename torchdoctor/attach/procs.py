"""Which processes to attach to: the PIDs given, or the local processes of a torchrun job.

Read-only: ``/proc/PID/environ`` (the rank's ``RANK``/``LOCAL_RANK``/``TORCHELASTIC_RUN_ID``),
the process table (psutil). Nothing here signals or stops a process. Every problem a user can
fix (no such PID, another user's process, no torchrun job found) is a :class:`DoctorError`
(exit 2) with the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from torchdoctor.errors import DoctorError

RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_RANK")
FR_KEYS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE", "HOME", "XDG_CACHE_HOME",
           "CUDA_VISIBLE_DEVICES")


@dataclass
class Target:
    pid: int
    cmdline: list[str]
    env: dict[str, str]  # only the keys the attach reads (RANK_KEYS, FR_KEYS)
    rank: int | None = None
    local_rank: int | None = None
    workers: list[int] = field(default_factory=list)  # child processes (DataLoader workers)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def to_dict(self) -> dict:
        return {"pid": self.pid, "rank": self.rank, "local_rank": self.local_rank,
                "cmdline": " ".join(self.cmdline)[:300], "workers": list(self.workers)}


def parse_environ(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def _no_such(pid: int) -> DoctorError:
    return DoctorError(f"no process with PID {pid}", "check the PID with `ps -ef`; the job may have ended")


def _denied(pid: int, what: str) -> DoctorError:
    return DoctorError(
        f"not allowed to read {what} of PID {pid} (it belongs to another user, or ptrace is restricted)",
        "run torchdoctor as the user that started the job (or as root); in a container start it with "
        "`--cap-add SYS_PTRACE`; on a host with Yama: `sudo sysctl kernel.yama.ptrace_scope=0`; "
        "see docs/attach.md")


def read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return parse_environ(f.read())
    except FileNotFoundError:
        raise _no_such(pid) from None
    except PermissionError:
        raise _denied(pid, "the environment") from None
    except ProcessLookupError:
        raise _no_such(pid) from None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def python_children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (DataLoader workers, compile workers), zombies included."""
    import psutil

    try:
        return sorted(c.pid for c in psutil.Process(pid).children(recursive=False))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def target(pid: int) -> Target:
    import psutil

    if pid <= 0:
        raise DoctorError(f"not a process ID: {pid}", "give the PID of a running Python process")
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
    except psutil.NoSuchProcess:
        raise _no_such(pid) from None
    except psutil.AccessDenied:
        raise _denied(pid, "the command line") from None
    if pid == os.getpid():
        raise DoctorError("torchdoctor cannot attach to itself", "give the PID of the training process")
    full = read_environ(pid)
    env = {k: full[k] for k in RANK_KEYS + FR_KEYS if k in full}
    return Target(pid, cmd, env, rank=_int(env.get("RANK")), local_rank=_int(env.get("LOCAL_RANK")),
                  workers=python_children(pid))


def _safe_env(pid: int) -> dict[str, str] | None:
    try:
        return read_environ(pid)
    except DoctorError:
        return None


def job_targets(pid: int | None) -> tuple[list[Target], dict]:
    """The ranks of one local torchrun job: from ``pid`` (the launcher, or any rank of it) or, with
    no PID, the one job running here. Returns the targets (by rank) and facts about the job."""
    import psutil

    if pid is not None:
        target(pid)  # a clear error for a bad PID
        env = _safe_env(pid) or {}
        launcher = pid
        if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:  # a rank: its parent is the agent
            launcher = psutil.Process(pid).ppid()
        kids = [p for p in python_children(launcher)]
        ranks = [(k, _safe_env(k) or {}) for k in kids]
        ranks = [(k, e) for k, e in ranks if "RANK" in e and "TORCHELASTIC_RUN_ID" in e]
        if not ranks:
            raise DoctorError(f"PID {pid} is not a torchrun launcher or rank: none of its children "
                              "has RANK and TORCHELASTIC_RUN_ID in its environment",
                              "give the ranks' PIDs instead: torchdoctor attach PID [PID...]")
    else:
        found: dict[str, list[tuple[int, dict]]] = {}
        for p in psutil.process_iter(["pid"]):
            if p.pid == os.getpid():
                continue
            e = _safe_env(p.pid)
            if e and "RANK" in e and "TORCHELASTIC_RUN_ID" in e:
                found.setdefault(e["TORCHELASTIC_RUN_ID"], []).append((p.pid, e))
        if not found:
            raise DoctorError("no torchrun job found on this machine (no process with RANK and "
                              "TORCHELASTIC_RUN_ID in its environment that this user may read)",
                              "give the launcher's PID (--job PID) or the ranks' PIDs")
        if len(found) > 1:
            jobs = "; ".join(f"run {rid}: PIDs {', '.join(str(p) for p, _ in v)}"
                             for rid, v in sorted(found.items()))
            raise DoctorError(f"{len(found)} torchrun jobs run here: {jobs}",
                              "pick one: torchdoctor attach --job PID")
        ranks = next(iter(found.values()))
        launcher = None
    targets = [target(k) for k, _ in ranks]
    targets.sort(key=lambda t: (t.rank if t.rank is not None else 1 << 30, t.pid))
    run_id = targets[0].env.get("TORCHELASTIC_RUN_ID")
    return targets, {"launcher_pid": launcher, "run_id": run_id,
                     "world_size": _int(targets[0].env.get("WORLD_SIZE"))}
