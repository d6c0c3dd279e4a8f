"""Collective self-test rules of `torchdoctor dist` (probe ``dist-selftest``).

Pure functions of :class:`~torchdoctor.distributed.evidence.SelftestEvidence` (the merged
self-test result and the link capacity of the GPUs it used). Codes:
``collective-selftest-failed`` (wrong values, crash, timeout), ``nccl-unavailable`` (the NCCL
self-test could not even create its process group; declared in rules/dist_env.py),
``allreduce-bandwidth-low``.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.distributed.evidence import SelftestEvidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.dist_env import NCCL_UNAVAILABLE
from torchdoctor.skills import DISTRIBUTED

# busbw below this share of the links' per-direction bandwidth is "far under" it.
# Healthy NCCL all-reduce reaches 65-90% of link bandwidth at >= 256 MiB (nccl-tests
# results; 2xH100 NVLink measured 329 GB/s of 478 GB/s = 69%, docs/dist.md); a
# disabled transport (P2P off -> host memory, NVLink -> PCIe) lands far below 50%.
LOW_FRACTION = 0.5
# busbw only approaches the link limit once messages are large; below this we do not judge.
MIN_JUDGED_BYTES = 64 << 20

ALLREDUCE_BANDWIDTH_LOW = declare(
    "allreduce-bandwidth-low", DISTRIBUTED, "warning",
    "measured all-reduce bus bandwidth far under what the links allow",
    thresholds={"LOW_FRACTION": LOW_FRACTION, "MIN_JUDGED_BYTES": MIN_JUDGED_BYTES})
COLLECTIVE_SELFTEST_FAILED = declare(
    "collective-selftest-failed", DISTRIBUTED, "error",
    "the collective self-test returned wrong values, crashed or did not finish in time")

INIT_PHASES = ("import", "init")


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


@rule("collective-selftest", probes={"dist-selftest"}, needs={"selftest"},
      raises=[COLLECTIVE_SELFTEST_FAILED, NCCL_UNAVAILABLE])
def selftest_failure(ev: SelftestEvidence) -> list[Finding]:
    """A self-test that did not end "ok" is a finding; which one depends on where it stopped."""
    st = ev.selftest
    status = st.get("status")
    if status in ("ok", "interrupted"):  # interrupted: stopped by the user, not a failure
        return []
    ranks = st.get("ranks") or []
    bad = [r for r in ranks if r.get("error")] or [r for r in ranks if r.get("phase") != "done"]
    first = bad[0] if bad else {}
    ev: dict[str, Any] = {"backend": st.get("backend"), "world_size": st.get("world_size"),
                          "status": status, "torchrun_exit": st.get("returncode")}
    if bad:
        ev["ranks"] = [f"rank {r.get('rank')}: {r.get('phase')}" + (f" ({r['error']})" if r.get("error") else "")
                       for r in bad]
    if first.get("stack"):
        ev["stack_rank"] = first.get("rank")
        ev["_stack"] = first["stack"]
    if not ranks and st.get("log_tail"):
        ev["log_tail"] = st["log_tail"][-1500:]
    if st.get("processes_left"):
        ev["processes_left"] = True
    if status == "wrong":
        wrong = [c for c in st.get("checks", []) if not c.get("ok")]
        ev["wrong"] = [f"{c['op']}: max abs error {c.get('max_abs_err')} on ranks {c.get('failed_ranks')}"
                       for c in wrong]
        return [finding("collective-selftest-failed",
                        f"{', '.join(c['op'] for c in wrong)} returned wrong values on {st.get('backend')}",
                        ev, "Re-run with NCCL_DEBUG=WARN; check GPU health (nvidia-smi -q -d ECC,ERRORS), "
                            "the driver, and NCCL_P2P_DISABLE=1 as a test: wrong results over P2P point to "
                            "IOMMU/ACS settings.")]
    in_init = bool(bad) and all(r.get("phase") in INIT_PHASES for r in bad)
    if st.get("backend") == "nccl" and in_init:
        return [finding("nccl-unavailable", "NCCL could not create a process group on the local GPUs",
                        ev, "Read the rank error above; run with NCCL_DEBUG=INFO for the failing step; check "
                            "NCCL_* variables, /dev/shm size (docker --shm-size) and that each rank sees "
                            "its GPU.")]
    where = (f"rank {first.get('rank')} in {first.get('phase')}" if first
             else "before any rank reported")
    what = "did not finish within the timeout" if status == "timeout" else "failed"
    return [finding("collective-selftest-failed",
                    f"the {st.get('backend')} collective self-test {what} ({where})", ev,
                    "Read the rank error and stack above; re-run with NCCL_DEBUG=WARN "
                    "TORCH_DISTRIBUTED_DEBUG=DETAIL; check firewall/loopback for the rendezvous port.")]


@rule("allreduce-bandwidth-low", probes={"dist-selftest"}, needs={"selftest", "capacity"},
      raises=[ALLREDUCE_BANDWIDTH_LOW])
def allreduce_bandwidth_low(ev: SelftestEvidence) -> list[Finding]:
    """allreduce-bandwidth-low from the largest measured size, or a skip with the reason."""
    st, capacity = ev.selftest, ev.capacity
    if st.get("backend") != "nccl":
        raise NotApplicable(f"link capacity is only known for NCCL on GPUs (backend {st.get('backend')})")
    if (st.get("world_size") or 0) < 2:
        raise NotApplicable("needs 2+ ranks")
    sweep = st.get("sweep") or []
    if not sweep:
        raise NotApplicable("no all-reduce size completed")
    top = max(sweep, key=lambda r: r["bytes"])
    if top["bytes"] < MIN_JUDGED_BYTES:
        raise NotApplicable(f"largest size {_fmt_bytes(top['bytes'])} is below "
                            f"{_fmt_bytes(MIN_JUDGED_BYTES)}: too small to reach link bandwidth")
    if not capacity.get("gbs"):
        raise NotApplicable(f"link capacity unknown: {capacity.get('reason') or 'no topology'}")
    best = max(r["busbw_gbs"] for r in sweep if r["bytes"] >= MIN_JUDGED_BYTES)
    ratio = best / capacity["gbs"]
    if ratio >= LOW_FRACTION:
        return []
    return [finding("allreduce-bandwidth-low",
                    f"all-reduce reaches {best:.1f} GB/s bus bandwidth, {ratio:.0%} of the "
                    f"{capacity['gbs']:.0f} GB/s the {capacity['kind']} links allow",
                    {"busbw_gbs": round(best, 2), "link_gbs": capacity["gbs"], "links": capacity["basis"],
                     "fraction": round(ratio, 3), "threshold": LOW_FRACTION,
                     "largest_size": _fmt_bytes(top["bytes"]), "ranks": st.get("world_size")},
                    "Look for nccl-env-risky findings (NCCL_P2P_DISABLE, channel caps) first; check "
                    "`nvidia-smi topo -m` and `nvidia-smi nvlink -s` for down links; make sure no other "
                    "job shares these GPUs during the test.")]

