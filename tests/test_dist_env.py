"""Pure rules of `torchdoctor dist`: env audit, topology capacity, bandwidth and self-test judgment."""

import pytest

from torchdoctor.distributed import topology
from torchdoctor.distributed.busbw import allreduce_bandwidth, allreduce_factor, median
from torchdoctor.distributed.evidence import LaunchEvidence, SelftestEvidence
from torchdoctor.distributed.selftest import merge, status_of
from torchdoctor.findings import Report
from torchdoctor.judge import judge

CPU = {"torch": "2.13", "dist_available": True, "backends": {"nccl": False, "gloo": True},
       "cuda_available": False, "cuda_device_count": 0, "host": {"ib_devices": [], "net_ifaces": ["eth0", "lo"]}}
GPU2 = {**CPU, "backends": {"nccl": True, "gloo": True}, "nccl_version": "2.27.3",
        "cuda_available": True, "cuda_device_count": 2}
GPU8_IB = {**GPU2, "cuda_device_count": 8, "host": {"ib_devices": ["mlx5_0", "mlx5_1"], "net_ifaces": ["ib0", "lo"]}}
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def _judge(probe, evidence, only=None):
    """(findings, [(rule, reason)]) of ``probe``'s rules (or only those named), as `dist` applies them."""
    rep = Report(command="dist")
    judge(probe, evidence, rep, only=only)
    return rep.findings, [(s.rule, s.reason) for s in rep.skipped]


def audit(env, facts, topo=None):
    return _judge("dist-env", LaunchEvidence(env, facts, topo))[0]


def audit_launch(env, facts):
    return _judge("dist-env", LaunchEvidence(env, facts), {"dist-launch-env"})[0]


def audit_backends(facts):
    return _judge("dist-env", LaunchEvidence({}, facts), {"dist-nccl-backend"})[0]


def audit_nccl_env(env, facts, topo=None):
    return _judge("dist-env", LaunchEvidence(env, facts, topo), {"dist-nccl-env"})[0]


def judge_selftest(st, capacity):
    return _judge("dist-selftest", SelftestEvidence(st, capacity))


def judge_bandwidth(st, capacity):
    return _judge("dist-selftest", SelftestEvidence(st, capacity), {"allreduce-bandwidth-low"})


def codes(fs):
    return [f.code for f in fs]


def titles(fs):
    return " | ".join(f.title for f in fs)


# --------------------------------------------------------------------------- healthy = silent
@pytest.mark.parametrize("env,facts", [
    ({}, CPU), ({}, GPU2), (TORCHRUN, GPU2), (TORCHRUN, CPU),
    ({"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
      "NCCL_SOCKET_IFNAME": "eth", "MASTER_ADDR": "127.0.0.1"}, GPU2),
    ({"NCCL_P2P_DISABLE": "1"}, {**GPU2, "cuda_device_count": 1}),  # one GPU: no peers to lose
    ({"NCCL_IB_DISABLE": "1"}, GPU2),  # no IB adapters here
    ({**TORCHRUN, "NCCL_IB_DISABLE": "1"}, GPU8_IB),  # single node (WORLD_SIZE == LOCAL_WORLD_SIZE)
    ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, GPU2),
    ({"TORCH_NCCL_BLOCKING_WAIT": "0", "TORCH_NCCL_ENABLE_MONITORING": "1"}, GPU2),
])
def test_healthy_environment_raises_nothing(env, facts):
    assert audit(env, {**facts, "master_addr_resolves": True if "MASTER_ADDR" in env else None}) == []


# --------------------------------------------------------------------------- launch variables
@pytest.mark.parametrize("env,facts,needle", [
    ({"RANK": "0"}, CPU, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, CPU, "WORLD_SIZE is set but RANK is not"),
    ({**TORCHRUN, "RANK": "2"}, CPU, "RANK=2 is not below WORLD_SIZE=2"),
    ({**TORCHRUN, "RANK": "-1"}, CPU, "RANK=-1 is negative"),
    ({**TORCHRUN, "WORLD_SIZE": "two"}, CPU, "WORLD_SIZE='two' is not an integer"),
    ({**TORCHRUN, "WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "0", "LOCAL_RANK": "0", "RANK": "0"}, CPU,
     "WORLD_SIZE=0 is below 1"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, CPU, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}, CPU, "LOCAL_WORLD_SIZE=4 exceeds WORLD_SIZE=2"),
    ({**TORCHRUN, "RANK": "0", "LOCAL_RANK": "1"}, CPU, "LOCAL_RANK=1 exceeds RANK=0"),
    ({**TORCHRUN, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3"}, GPU2,
     "LOCAL_RANK=3 but only 2 GPU(s) are visible"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, CPU, "MASTER_ADDR and MASTER_PORT are not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, CPU, "MASTER_PORT is not set"),
    ({**TORCHRUN, "MASTER_PORT": "70000"}, CPU, "MASTER_PORT=70000 is not a TCP port"),
    ({**TORCHRUN, "MASTER_ADDR": ""}, CPU, "MASTER_ADDR is set but empty"),
])
def test_inconsistent_launch_variables(env, facts, needle):
    fs = audit_launch(env, {**facts, "master_addr_resolves": True})
    assert set(codes(fs)) == {"dist-env-inconsistent"}
    assert needle in titles(fs)
    assert all(f.severity == "error" for f in fs)


def test_master_addr_that_does_not_resolve():
    fs = audit_launch({**TORCHRUN, "MASTER_ADDR": "no-such-host.invalid"},
                               {**CPU, "master_addr_resolves": False})
    assert "does not resolve" in titles(fs)
    # an unanswered lookup (None) is not evidence
    assert audit_launch({**TORCHRUN, "MASTER_ADDR": "slow"}, {**CPU, "master_addr_resolves": None}) == []


def test_local_rank_vs_gpus_needs_cuda():
    env = {**TORCHRUN, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3"}
    assert audit_launch(env, CPU) == []  # gloo on CPU: no GPU to miss


# --------------------------------------------------------------------------- backends
def test_nccl_unavailable_when_cuda_but_no_nccl():
    fs = audit_backends({**GPU2, "backends": {"nccl": False, "gloo": True}})
    assert codes(fs) == ["nccl-unavailable"] and fs[0].severity == "error"
    fs = audit_backends({**GPU2, "dist_available": False})
    assert codes(fs) == ["nccl-unavailable"]
    fs = audit_backends({**GPU2, "nccl_error": "OSError: libnccl.so.2: cannot open"})
    assert "cannot be loaded" in fs[0].title
    assert audit_backends(GPU2) == []
    assert audit_backends(CPU) == []  # no CUDA: NCCL is not expected


# --------------------------------------------------------------------------- risky variables
@pytest.mark.parametrize("env,facts,var,sev", [
    ({"NCCL_P2P_DISABLE": "1"}, GPU2, "NCCL_P2P_DISABLE", "warning"),
    ({"NCCL_P2P_LEVEL": "LOC"}, GPU2, "NCCL_P2P_LEVEL", "warning"),
    ({"NCCL_IB_DISABLE": "1"}, GPU8_IB, "NCCL_IB_DISABLE", "warning"),
    ({"NCCL_NET": "Socket"}, GPU8_IB, "NCCL_NET", "warning"),
    ({"NCCL_NET_GDR_LEVEL": "LOC"}, GPU8_IB, "NCCL_NET_GDR_LEVEL", "warning"),
    ({"NCCL_MAX_NCHANNELS": "1"}, GPU2, "NCCL_MAX_NCHANNELS", "warning"),
    ({"NCCL_MAX_CTAS": "2"}, GPU2, "NCCL_MAX_CTAS", "warning"),
    ({"NCCL_DEBUG": "TRACE"}, GPU2, "NCCL_DEBUG", "warning"),
    ({"NCCL_ALGO": "Tree"}, GPU2, "NCCL_ALGO", "info"),
    ({"NCCL_PROTO": "Simple"}, GPU2, "NCCL_PROTO", "info"),
    ({"NCCL_SOCKET_IFNAME": "eno1"}, GPU2, "NCCL_SOCKET_IFNAME", "warning"),
    ({"GLOO_SOCKET_IFNAME": "eth"}, CPU, "GLOO_SOCKET_IFNAME", "warning"),  # gloo wants exact names
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, CPU, "TORCH_DISTRIBUTED_DEBUG", "info"),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, GPU2, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "warning"),
    ({"TORCH_NCCL_ENABLE_MONITORING": "0"}, GPU2, "TORCH_NCCL_ENABLE_MONITORING", "warning"),
    ({"TORCH_NCCL_BLOCKING_WAIT": "1"}, GPU2, "TORCH_NCCL_BLOCKING_WAIT", "info"),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, GPU2, "TORCH_NCCL_TRACE_BUFFER_SIZE", "info"),
    ({"TORCH_NCCL_BLOCKING_WAIT": "on"}, GPU2, "TORCH_NCCL_BLOCKING_WAIT", "warning"),
    ({"NCCL_BLOCKING_WAIT": "0"}, GPU2, "NCCL_BLOCKING_WAIT", "warning"),
])
def test_risky_variable(env, facts, var, sev):
    fs = audit_nccl_env(env, facts)
    assert len(fs) == 1, titles(fs)
    f = fs[0]
    assert (f.code, f.severity, f.evidence["variable"], f.evidence["value"]) == ("nccl-env-risky", sev, var, env[var])
    assert f.fix and f.evidence["effect"]


def test_deprecated_async_error_handling_zero_is_both_deprecated_and_unhandled():
    fs = audit_nccl_env({"NCCL_ASYNC_ERROR_HANDLING": "0"}, GPU2)
    assert [f.evidence["variable"] for f in fs] == ["NCCL_ASYNC_ERROR_HANDLING"] * 2
    assert "not handled" in titles(fs) and "deprecated" in titles(fs)


def test_torch_name_wins_over_deprecated_alias():
    env = {"NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    fs = audit_nccl_env(env, GPU2)
    assert codes(fs) == ["nccl-env-risky"]  # only the deprecation: the effective value is 3
    assert "ignored" in fs[0].evidence["effect"]


def test_shm_disable_only_matters_without_p2p():
    assert audit_nccl_env({"NCCL_SHM_DISABLE": "1"}, GPU2) == []
    assert len(audit_nccl_env({"NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}, GPU2)) == 2
    topo = {"pairs": [{"a": 0, "b": 1, "p2p_read": "not supported"}]}
    fs = audit_nccl_env({"NCCL_SHM_DISABLE": "1"}, GPU2, topo)
    assert codes(fs) == ["nccl-env-risky"]


@pytest.mark.parametrize("value", ["4", "16"])
def test_moderate_channel_caps_are_not_flagged(value):
    assert audit_nccl_env({"NCCL_MAX_NCHANNELS": value}, GPU2) == []


# --------------------------------------------------------------------------- bandwidth arithmetic
def test_busbw_follows_nccl_tests():
    assert allreduce_factor(2) == 1.0 and allreduce_factor(8) == 1.75 and allreduce_factor(1) == 0.0
    algbw, busbw = allreduce_bandwidth(1 << 30, 0.004, 8)
    assert algbw == pytest.approx((1 << 30) / 0.004 / 1e9)
    assert busbw == pytest.approx(algbw * 1.75)
    with pytest.raises(ValueError):
        allreduce_bandwidth(1, 0.0, 2)
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5


# --------------------------------------------------------------------------- topology -> capacity
def _gpu(i, bus, links=(), speed=None, gen=5, width=16, version=6):
    return {"nvml_index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}", "pci_bus_id": bus,
            "pcie": {"max_gen": gen, "max_width": width},
            "nvlink": {"active_links": len(links), "speed_mbps_common": speed,
                       "links": [{"link": k, "version": version, "remote_type": t, "remote_bus_id": r}
                                 for k, (t, r) in enumerate(links)]}}


def hgx(n=2, nlinks=18, speed=26562):
    gpus = [_gpu(i, f"0000:{0x18 + i:02x}:00.0", [("switch", "0000:a0:00.0")] * nlinks, speed)
            for i in range(n)]
    pairs = [{"a": a, "b": b, "p2p_read": "ok"} for a in range(n) for b in range(a + 1, n)]
    return {"available": True, "gpus": gpus, "pairs": pairs}


def test_capacity_nvswitch():
    cap = topology.link_capacity(hgx(), hgx()["gpus"])
    assert cap["kind"] == "nvlink" and cap["gbs"] == pytest.approx(18 * 26.562, rel=1e-3)


def test_capacity_slowest_gpu_bounds_the_ring_and_version_fallback():
    t = hgx(nlinks=18, speed=None)
    t["gpus"][1]["nvlink"]["links"] = t["gpus"][1]["nvlink"]["links"][:12]  # 6 links down on GPU1
    cap = topology.link_capacity(t, t["gpus"])
    assert cap["gbs"] == pytest.approx(12 * 25.0)


def test_capacity_direct_nvlink_counts_only_links_to_used_peers():
    a, b, c = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"
    gpus = [_gpu(0, a, [("gpu", b)] * 4 + [("gpu", c)] * 4, 25000), _gpu(1, b, [("gpu", a)] * 4, 25000),
            _gpu(2, c, [("gpu", a)] * 4, 25000)]
    topo = {"available": True, "gpus": gpus, "pairs": []}
    assert topology.link_capacity(topo, gpus[:2])["gbs"] == pytest.approx(100.0)


def test_capacity_pcie_and_unknown_cases():
    gpus = [_gpu(0, "0000:01:00.0", gen=4), _gpu(1, "0000:02:00.0", gen=4)]
    topo = {"available": True, "gpus": gpus, "pairs": [{"a": 0, "b": 1, "p2p_read": "ok"}]}
    cap = topology.link_capacity(topo, gpus)
    assert cap["kind"] == "pcie" and cap["gbs"] == pytest.approx(1.969 * 16, rel=1e-3)
    topo["pairs"][0]["p2p_read"] = "chipset not supported"
    assert topology.link_capacity(topo, gpus)["gbs"] is None
    assert topology.link_capacity({"available": False, "reason": "no NVML"}, None)["gbs"] is None
    assert topology.link_capacity(topo, gpus[:1])["gbs"] is None
    # NVLink of the ambiguous version 5 without a speed field: not guessed, falls back to PCIe
    t = hgx(speed=None)
    for g in t["gpus"]:
        for lk in g["nvlink"]["links"]:
            lk["version"] = 5
    assert topology.link_capacity(t, t["gpus"])["kind"] == "pcie"


def test_select_gpus_by_uuid_bus_or_all():
    t = hgx(4)
    assert [g["nvml_index"] for g in topology.select_gpus(t, ["GPU-3", "GPU-1"], None, 2)] == [3, 1]
    assert [g["nvml_index"] for g in topology.select_gpus(t, None, ["0000:19:00.0", "00000000:1A:00.0"], 2)] == [1, 2]
    assert len(topology.select_gpus(t, None, None, 4)) == 4
    assert topology.select_gpus(t, None, None, 2) is None


# --------------------------------------------------------------------------- self-test judgment
def rank_rec(rank, n=2, times=(0.004,), ok=True, phase="done", error=None, sizes=(1 << 30,)):
    return {"rank": rank, "world_size": n, "backend": "nccl", "phase": phase, "error": error,
            "checks": [{"op": op, "ok": ok or op != "all_reduce", "max_abs_err": 0.0 if ok else 1.0, "error": None}
                       for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")],
            "sweep": [{"bytes": s, "iters": 10, "rep_s": list(times)} for s in sizes]}


def merged(ranks, rc=0, timed_out=False, n=2):
    m = merge(ranks, nproc=n, backend="nccl", sizes=[1 << 30])
    m.update(returncode=rc, timed_out=timed_out)
    m["status"] = status_of(m)
    return m


NVL = {"gbs": 478.1, "kind": "nvlink", "basis": "18 NVLink links x 26.562 GB/s"}


def test_merge_averages_rank_medians_and_computes_busbw():
    m = merged([rank_rec(0, times=(0.0033, 0.0032, 0.0040)), rank_rec(1, times=(0.0035,))])
    row = m["sweep"][0]
    assert row["time_us"] == pytest.approx(3400.0)
    assert row["busbw_gbs"] == pytest.approx((1 << 30) / 0.0034 / 1e9, rel=1e-3)
    assert m["status"] == "ok" and all(c["ok"] for c in m["checks"])


def test_healthy_fast_selftest_raises_nothing():
    fs, skips = judge_selftest(merged([rank_rec(0), rank_rec(1)]), NVL)  # 268 GB/s = 56%
    assert fs == [] and skips == []


def test_slow_allreduce_is_flagged():
    m = merged([rank_rec(0, times=(0.030,)), rank_rec(1, times=(0.030,))])  # 35.8 GB/s: P2P off
    fs, _ = judge_selftest(m, NVL)
    assert codes(fs) == ["allreduce-bandwidth-low"] and fs[0].severity == "warning"
    assert fs[0].evidence["fraction"] < 0.1


@pytest.mark.parametrize("st,cap,reason", [
    ({"backend": "gloo", "world_size": 2, "sweep": [{"bytes": 1 << 30, "busbw_gbs": 1.0}]}, NVL, "only known for NCCL"),
    ({"backend": "nccl", "world_size": 1, "sweep": []}, NVL, "2+ ranks"),
    ({"backend": "nccl", "world_size": 2, "sweep": [{"bytes": 1 << 20, "busbw_gbs": 1.0}]}, NVL, "too small"),
    ({"backend": "nccl", "world_size": 2, "sweep": [{"bytes": 1 << 30, "busbw_gbs": 1.0}]},
     {"gbs": None, "reason": "no NVML"}, "capacity unknown"),
])
def test_bandwidth_rule_skips_without_evidence(st, cap, reason):
    fs, skips = judge_bandwidth(st, cap)
    assert fs == [] and reason in skips[0][1]


def test_wrong_values_and_failures():
    fs, _ = judge_selftest(merged([rank_rec(0), rank_rec(1, ok=False)]), NVL)
    assert codes(fs) == ["collective-selftest-failed"] and "all_reduce returned wrong values" in fs[0].title
    crash = [rank_rec(0, phase="init"), {**rank_rec(1, phase="init", error="RuntimeError: ncclInternalError"),
                                         "checks": [], "sweep": []}]
    crash[0].update(checks=[], sweep=[])
    fs, _ = judge_selftest(merged(crash, rc=1), NVL)
    assert codes(fs) == ["nccl-unavailable"]
    hang = [{**rank_rec(0, phase="check:all_reduce"), "checks": [], "sweep": []},
            {**rank_rec(1, phase="check:all_reduce"), "checks": [], "sweep": []}]
    fs, skips = judge_selftest(merged(hang, rc=None, timed_out=True), NVL)
    assert codes(fs) == ["collective-selftest-failed"] and "did not finish within the timeout" in fs[0].title
    assert "rank 0: check:all_reduce" in fs[0].evidence["ranks"]
    assert skips and skips[0][0] == "allreduce-bandwidth-low"


def test_missing_rank_means_not_verified():
    m = merged([rank_rec(0)], rc=1)
    assert m["status"] == "failed" and not any(c["ok"] for c in m["checks"])


def test_selftest_and_launch_rules_stay_out_of_the_script_probe():
    """`dist SCRIPT` judges each rank's Evidence with the rules of probe "dist" (distributed/ranked.py):
    the self-test and launch rules, which read other evidence, must not be among them."""
    from torchdoctor.judge import rules_for

    ours = {r.name for p in ("dist-env", "dist-selftest") for r in rules_for(p)}
    assert ours == {"dist-launch-env", "dist-nccl-backend", "dist-nccl-env", "collective-selftest",
                    "allreduce-bandwidth-low", "inter-node-sockets"}
    assert ours.isdisjoint(r.name for p in ("dist", "run", "ranks") for r in rules_for(p))
