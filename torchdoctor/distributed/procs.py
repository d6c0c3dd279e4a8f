"""Process facts shared by the self-test and the ranked runs: rank clean-up, /proc reads (Linux)."""

from __future__ import annotations

from pathlib import Path


def die_with_parent() -> None:
    """Linux: SIGKILL this rank when the torchrun agent dies, so no rank outlives the launch."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except Exception:  # noqa: BLE001 - best effort; the parent also kills by pid
        pass


def live_cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid`` if it is alive and not a zombie, else None."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return None
    return [c.decode(errors="replace") for c in cmd]
