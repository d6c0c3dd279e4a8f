"""FSDP2 (``fully_shard``), DTensor tensor parallelism and 2-D device meshes under the script
probes: 2 gloo ranks on CPU (CI), NCCL on 2+ GPUs (multigpu).

The CPU tests read the session's one run of each fixture (tests/fixture_runs.py), shared with
the end-to-end test; the pure tests (the DTensor facade on stand-in objects, the cross-rank fold
of received gradients) need no launch.
"""

from __future__ import annotations

import json
import math
import os
import sys
import types
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fixture_runs import host_noise, run_fixture
from torchdoctor.findings import Finding

DIST = ROOT / "tests" / "fixtures" / "scripts" / "dist"
NAN_CMD = "nan --nproc-per-node 2 --timeout 180"
TWO_D_CMD = "checkup --nproc-per-node 2 --timeout 180 --out {tmp} -- {tmp}"


def codes(report: dict, severities=("error", "warning")) -> list[str]:
    """The findings' codes, host load left out (tests/fixture_runs.host_noise: other work on the
    shared box, not the script)."""
    return sorted(f["code"] for f in report["findings"]
                  if f["severity"] in severities and not host_noise(f))


def events(run_dir: Path, kind: str) -> list[dict]:
    out = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") == kind:
            out.append(e)
    return out


# ------------------------------------------------------------------------------ CPU / gloo
@pytest.mark.slow
def test_fsdp2_planted_nan_is_named_by_fqn_and_rank_and_every_rank_stops_there():
    r = run_fixture("dist/fsdp2_nan.py", NAN_CMD).report
    assert codes(r) == ["nonfinite-forward"], r["findings"]
    [f] = r["findings"]
    assert f["title"].startswith("rank 1: first non-finite value (NaN) at step 3: made by "
                                 "model.blocks.0.attn (Attention)'s own forward code"), f["title"]
    ev = f["evidence"]
    assert ev["ranks"] == ["rank 1"] and ev["module"] == "model.blocks.0.attn"
    # rank 0's gradient shards were NaN (the reduce-scatter): folded, not a second error
    assert "received from rank 1 through the gradient reduction" in ev["other_rank_outcomes"]["rank 0"]
    ranks = r["metrics"]["run"]["ranks"]
    assert [(x["outcome"], x["steps"]) for x in ranks] == [("stopped", 3), ("stopped", 3)], ranks


@pytest.mark.slow
def test_2d_mesh_healthy_and_grad_norm_is_the_full_gradients_norm():
    """FSDP2 over mesh["dp"] and tensor parallelism over mesh["tp"] (sub-meshes, _StridedShard
    placements): no finding, no internal error, and the monitor's gradient norm on every rank
    equals the norm of the gathered full gradients the script logged."""
    run = run_fixture("dist/fsdp_tp_2d.py", TWO_D_CMD)
    r = run.report
    assert run.returncode == 0, run.stderr[-3000:]
    assert codes(r, ("error", "warning", "info")) == [], r["findings"]
    for rank in (0, 1):
        d = run.tmp / "run" / f"rank{rank}"
        assert not events(d, "instrument_error"), events(d, "instrument_error")
        got = [x for e in events(d, "numerics") for x in e["grad_norm"]]
        want = json.loads((run.tmp / f"clip_norms.rank{rank}.json").read_text())
        assert len(got) == len(want) == 6
        for g, w in zip(got, want):
            assert math.isclose(g, w, rel_tol=1e-5), (rank, got, want)
        [mon] = events(d, "nan_monitor")
        assert mon["sharded_rows"] == 6 and mon["partial_grads"] == 0


TRAINING_CMD = "checkup --nproc-per-node 2 --timeout 180"


@pytest.mark.slow
def test_fsdp2_bookkeeping_bugs_are_named_by_fqn_on_every_rank():
    r = run_fixture("dist/fsdp2_training_bugs.py", TRAINING_CMD).report
    assert codes(r) == ["eval-mode-training", "params-not-in-optimizer", "unused-parameters"], r["findings"]
    by = {f["code"]: f["evidence"] for f in r["findings"]}
    assert by["unused-parameters"]["params"] == ["model.blocks.1.attn.gate.weight",
                                                 "model.blocks.1.attn.gate.bias"]
    assert by["params-not-in-optimizer"]["params"] == ["model.emb.weight", "model.norm.weight",
                                                       "model.norm.bias", "model.head.weight",
                                                       "model.head.bias"]
    assert by["params-not-in-optimizer"]["values"] == 64 * 32 + 32 + 32 + 32 * 64 + 64  # full sizes
    assert by["eval-mode-training"]["step"] == 4
    assert all(e["ranks"] == "all" for e in by.values())
    mem = r["metrics"]["memory"]["by_rank"]  # both ranks measured, the skew across them
    assert [x["rank"] for x in mem["per_rank"]] == [0, 1] and mem["basis"] == "host_rss_peak"
    assert mem["skew"] >= 1.0


def _audit(path):
    from torchdoctor.pipeline.checkpoint import Options, run

    return run(str(path), Options())


@pytest.mark.slow
def test_sharded_dcp_checkpoint_of_a_2d_run_is_healthy_and_names_its_writers():
    """The 2-D fixture's dcp.save of get_state_dict (DTensor model and optimizer state)."""
    ckpt = run_fixture("dist/fsdp_tp_2d.py", TWO_D_CMD).tmp / "ckpt"
    rep = _audit(ckpt)
    assert rep.findings == [], [(f.code, f.title) for f in rep.findings]
    m = rep.metrics["checkpoint"]
    assert m["format"] == "dcp" and m["format_metadata"]["dcp_writer_ranks"] == 2
    roles = m["roles"]
    assert roles["optimizer"][0]["states"] == roles["optimizer"][0]["params"] == 37
    assert roles["progress"] == {"step": 6}


@pytest.mark.slow
def test_sharded_dcp_missing_a_rank_file_names_that_rank_once(tmp_path):
    import shutil

    src = run_fixture("dist/fsdp_tp_2d.py", TWO_D_CMD).tmp / "ckpt"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt)
    (ckpt / "__1_0.distcp").unlink()
    rep = _audit(ckpt)
    got = {f.code: f for f in rep.findings}
    # one problem for the file (not one per tensor); the step counter whose bytes were in it is
    # present-but-unread, not "no progress counter" (a false alarm before)
    assert "ckpt-missing-progress" not in got, [(f.code, f.title) for f in rep.findings]
    f = got["ckpt-unreadable"]
    assert f.severity == "error"
    assert f.title.startswith("1 part of the checkpoint could not be read: __1_0.distcp: data file "
                              "missing (written by rank 1 of 2):"), f.title


# ------------------------------------------------------------------------------ pure
class _Placement:
    def __init__(self, kind: str):
        self.kind = kind

    def is_replicate(self) -> bool:
        return self.kind == "R"

    def is_partial(self) -> bool:
        return self.kind == "P"

    def is_shard(self) -> bool:
        return self.kind == "S"  # a _StridedShard says False here, as in torch 2.13


class _Mesh:
    ndim = 2
    shape = (2, 4)

    def size(self, i: int) -> int:
        return self.shape[i]


@pytest.fixture
def fake_dtensor(monkeypatch):
    """A stand-in DTensor class in a stand-in torch.distributed.tensor._api module."""
    from torchdoctor import torch_internals as ti

    class DTensor:
        def __init__(self, placements, local=None):
            self.placements = [_Placement(k) for k in placements]
            self.device_mesh = _Mesh()
            self._local_tensor = local

    mod = types.ModuleType("torch.distributed.tensor._api")
    mod.DTensor = DTensor
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor._api", mod)
    monkeypatch.setattr(ti, "_DTENSOR", [])
    return DTensor


def test_dtensor_norm_share_weights_by_placement(fake_dtensor):
    from torchdoctor.torch_internals import dtensor_norm_share, is_dtensor, local_tensor

    sentinel = object()
    t = fake_dtensor("SS", sentinel)
    assert is_dtensor(t) and local_tensor(t) is sentinel
    assert local_tensor(sentinel) is sentinel
    assert dtensor_norm_share(t)[1] == 1.0  # elements split over all 8 ranks
    assert dtensor_norm_share(fake_dtensor("SR"))[1] == 0.25  # repeated on the 4 tp ranks
    assert dtensor_norm_share(fake_dtensor("RR"))[1] == 1 / 8
    assert dtensor_norm_share(fake_dtensor("XS"))[1] == 1.0  # _StridedShard: is_shard() False
    assert dtensor_norm_share(fake_dtensor("PS")) is None  # pending sums: no share
    assert dtensor_norm_share(sentinel) is None


def test_no_dtensor_module_means_no_dtensor(monkeypatch):
    from torchdoctor import torch_internals as ti

    monkeypatch.setattr(ti, "_DTENSOR", [])
    for name in ti._DTENSOR_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert ti.dtensor_class() is None and not ti.is_dtensor(object())


def _nf(code: str, step: int, title: str = "t") -> Finding:
    return Finding(code=code, skill="debugging", severity="error", title=title,
                   evidence={"step": step}, fix="", docs="")


def test_received_gradients_fold_into_the_rank_that_made_the_nan():
    from torchdoctor.distributed.ranked import _fold_received_gradients

    by_code = {"nonfinite-forward": [(1, _nf("nonfinite-forward", 3))],
               "nonfinite-gradient": [(0, _nf("nonfinite-gradient", 3)), (2, _nf("nonfinite-gradient", 4))]}
    folded = _fold_received_gradients(by_code)
    assert "nonfinite-gradient" not in by_code
    assert sorted(folded["nonfinite-forward"]) == ["rank 0", "rank 2"]
    assert "from rank 1" in folded["nonfinite-forward"]["rank 0"]


def test_a_gradient_nan_before_any_forward_nan_stays_its_own_finding():
    from torchdoctor.distributed.ranked import _fold_received_gradients

    by_code = {"nonfinite-loss": [(1, _nf("nonfinite-loss", 5))],
               "nonfinite-gradient": [(0, _nf("nonfinite-gradient", 2))]}
    assert _fold_received_gradients(by_code) == {}
    assert [r for r, _f in by_code["nonfinite-gradient"]] == [0]
    only_grads = {"nonfinite-gradient": [(0, _nf("nonfinite-gradient", 2))]}
    assert _fold_received_gradients(only_grads) == {} and len(only_grads["nonfinite-gradient"]) == 1


# ------------------------------------------------------------------------------ NCCL (2+ GPUs)
def _gpu_run(tmp_path: Path, cmd: str, script: str, *args: str, timeout: float = 240) -> dict:
    p = run_cli(cmd, "--json", "--nproc-per-node", 2, "--timeout", timeout, "--out", tmp_path,
                script, *args, cwd=DIST, timeout=timeout + 60)
    assert p.stdout.strip(), p.stderr[-3000:]
    return json.loads(p.stdout)


@pytest.mark.multigpu
def test_nccl_fsdp2_planted_nan_is_named_by_fqn_and_rank(tmp_path):
    """On 4xH200 this raised nonfinite-gradient (rank 0) and collective-hang: each rank read its
    step-3 row when its own copy had landed, so rank 0 stopped at step 3 and rank 1 went on into
    step 4's collectives alone. Rows are now read at the next row's close on every rank
    (tests/test_nan_lockstep.py): both ranks stop at the end of step 4, rank 0's NaN gradient
    shards folded into rank 1's finding."""
    r = _gpu_run(tmp_path, "nan", "fsdp2_nan.py")
    assert codes(r) == ["nonfinite-forward"], r["findings"]
    [f] = r["findings"]
    assert f["evidence"]["module"] == "model.blocks.0.attn"
    assert f["evidence"]["ranks"] == ["rank 1"]
    assert "received from rank 1 through the gradient reduction" in \
        f["evidence"]["other_rank_outcomes"]["rank 0"]
    ranks = r["metrics"]["run"]["ranks"]
    assert [(x["outcome"], x["steps"]) for x in ranks] == [("stopped", 4), ("stopped", 4)], ranks
    assert r["context"]["device"].startswith("cuda")


@pytest.mark.multigpu
def test_nccl_fsdp1_grad_norm_is_fsdps_own(tmp_path):
    """FSDP1 flat parameters are plain tensors holding a shard: the monitor sums them over the
    unit's process group (measured on 2 gloo ranks: 0.7778169 vs FSDP's 0.7778168; before, the
    local shard's norm)."""
    r = _gpu_run(tmp_path, "checkup", "fsdp1_norm.py", str(tmp_path))
    assert codes(r) == [], r["findings"]
    for rank in (0, 1):
        d = tmp_path / "run" / f"rank{rank}"
        got = [x for e in events(d, "numerics") for x in e["grad_norm"]]
        want = json.loads((tmp_path / f"clip_norms.rank{rank}.json").read_text())
        assert len(got) == len(want) == 6
        assert all(math.isclose(g, w, rel_tol=1e-4) for g, w in zip(got, want)), (got, want)


@pytest.mark.multigpu
@pytest.mark.parametrize("cmd", ["checkup", "profile", "memory", "nan", "dist"])
def test_nccl_2d_mesh_is_clean_under_every_probe(tmp_path, cmd):
    r = _gpu_run(tmp_path, cmd, "fsdp_tp_2d.py", str(tmp_path))
    assert codes(r) == [], r["findings"]
    assert not [f for f in r["findings"] if f["code"] == "internal-error"], r["findings"]
    if cmd in ("checkup", "nan"):
        for rank in (0, 1):
            d = tmp_path / "run" / f"rank{rank}"
            got = [x for e in events(d, "numerics") for x in e["grad_norm"]]
            want = json.loads((tmp_path / f"clip_norms.rank{rank}.json").read_text())
            assert all(math.isclose(g, w, rel_tol=1e-4) for g, w in zip(got, want)), (got, want)


def test_saved_tensor_counter_holds_a_tensor_without_a_readable_storage():
    """FSDP2's unsharded parameters, saved for backward by F.linear, raised "Attempted to access
    the data pointer on an invalid python storage" in the memory probe's pack hook, which failed
    the user's forward (the 2-D fixture crashed under `memory`)."""
    from torchdoctor.memory.saved import SavedTensors

    class NoStorage:
        is_cuda = False

        def untyped_storage(self):
            raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")

    st = SavedTensors()
    t = NoStorage()
    h = st._pack(t)
    assert st._unpack(h) is t and st.bytes == [0, 0] and not st.table
    del h  # its release is a no-op


def test_memory_by_rank_names_the_highest_rank_and_the_skew():
    from torchdoctor.evidence.memranks import memory_by_rank
    from torchdoctor.evidence import Evidence

    def ev(*rss, cuda=None):
        evs = [{"kind": "mem", "step": i + 1, "heap": 100, "rss": v} for i, v in enumerate(rss)]
        if cuda is not None:
            evs.append({"kind": "mem_end", "cuda": {"0": {"peak_allocated": cuda}}})
        return Evidence.from_events(evs)

    got = memory_by_rank({0: ev(10, 30), 1: ev(20, 60)})
    assert got["basis"] == "host_rss_peak" and got["max_rank"] == 1 and got["min_rank"] == 0
    assert got["per_rank"] == [{"rank": 0, "peak_bytes": 30}, {"rank": 1, "peak_bytes": 60}]
    assert got["skew"] == 2.0 and got["spread_bytes"] == 30
    # the device's peak when every rank has one
    got = memory_by_rank({0: ev(10, cuda=500), 1: ev(10, cuda=400)})
    assert got["basis"] == "cuda_peak_allocated" and got["max_rank"] == 0 and got["skew"] == 1.25
    got = memory_by_rank({0: ev(1000), 1: ev(1004)})  # within noise: even, no rank named
    assert got["even"] and got["max_rank"] is None and got["min_rank"] is None and got["skew"] == 1.004
    assert memory_by_rank({0: ev(10)}) is None  # one rank: no skew
    assert memory_by_rank({0: ev(10), 1: Evidence.from_events([])}) is None


def test_finite_local_shards_under_a_non_finite_mesh_norm_point_to_another_rank():
    """The summed norm of a sharded row is NaN but this rank's shards are finite: the bad value
    is on another rank (which names it); this rank says so instead of reporting an overflow."""
    import torch

    from torchdoctor.numerics.locate import Locator

    def row(sharded):
        return types.SimpleNamespace(norms=[1.0, 2.0], params=[], live=False, sharded=sharded,
                                     elsewhere=False, win=None, step=3, gnorm64=None)

    emitted = []
    loc = Locator(torch, set(), lambda kind, **k: emitted.append(kind))
    r = row(True)
    assert loc.grads(r, None) is None and r.elsewhere and emitted == []
    r = row(False)  # one rank's own gradients: a finite set whose float32 norm overflowed
    assert loc.grads(r, None) is None and not r.elsewhere and emitted == ["grad_norm_overflow"]


def test_sharded_norm_adds_weighted_shares_on_both_row_paths():
    """The row's norm from local norms: plain gradients once, DTensor shares weighted (a mesh of
    one rank: no collective); a Partial gradient keeps only its NaN. CPU floats and the device
    tensor path (what a CUDA row takes) agree."""
    import torch

    from torchdoctor.numerics.sharded import ShardedNorm

    class OneRankMesh:
        ndim = 1
        device_type = "cpu"

        def size(self, i):
            return 1

        def get_group(self, i):  # never asked: a dimension of one rank has nothing to sum
            raise AssertionError("no group for a one-rank dimension")

    mesh = OneRankMesh()
    sn = ShardedNorm()
    sn.add(0, (mesh, 1.0), mesh)  # a Shard: its elements
    sn.add(2, (mesh, 0.25), mesh)  # replicated 4 ways: a quarter of its square per rank
    norms = [3.0, 4.0, 2.0]  # index 1 is a plain tensor
    want = math.sqrt(9 + 16 + 0.25 * 4)
    assert math.isclose(sn.total_cpu(torch, norms), want)
    assert math.isclose(float(sn.total_dev(torch, torch.tensor(norms))), want)
    sn.add(3, None, mesh)  # Partial: finiteness only
    assert math.isclose(sn.total_cpu(torch, norms + [7.0]), want) and sn.partial == [3]
    assert math.isnan(sn.total_cpu(torch, norms + [math.nan]))
    assert math.isnan(float(sn.total_dev(torch, torch.tensor(norms + [math.inf]))))


FSDP2_ONE_RANK = r"""
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=init_device_mesh("cpu", (1,)))
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
opt = torch.optim.AdamW(model.parameters())
norms = []
for step in range(4):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).full_tensor().item())
    opt.step()
json.dump(norms, open(sys.argv[1], "w"))
# a per-rank torch.save of the sharded state (DTensors): audited by its own test
torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 4}, sys.argv[2])
dist.destroy_process_group()
"""

HARNESS = r"""
import json, runpy, sys, tempfile
from pathlib import Path
from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.registry import armed_needs
from torchdoctor.runner.context import HarnessContext
from torchdoctor.runner.core import Core
from torchdoctor.runner.harness import _armed
from torchdoctor.runner.rundir import META, EvidenceWriter, write_json
script, norms_file, ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
opts = {"steps": 50, "nan_async_test": True}  # the CUDA row path (device tensors), on CPU
d = Path(tempfile.mkdtemp())
write_json(d / META, {"probe": "checkup", "argv": [script], "options": opts})
writer = EvidenceWriter(d)
ctx = HarnessContext("checkup", d, opts, writer)
core = Core(ctx, _armed(sorted(armed_needs("checkup"))))
core.install()
try:
    sys.argv = [script, norms_file, ckpt]
    runpy.run_path(script, run_name="__main__")
finally:
    core.uninstall()
    writer.close()
ev = Evidence.load(d)
print(json.dumps({"errors": [e.get("traceback", "")[-300:] for e in ev.of("instrument_error")],
                  "norms": [x for e in ev.of("numerics") for x in e["grad_norm"]],
                  "monitor": ev.last("nan_monitor")}))
"""


@pytest.fixture(scope="module")
def one_rank_fsdp2(tmp_path_factory):
    """One subprocess: a 1-rank FSDP2 model trained under the checkup instruments on the
    device-row path, then its sharded state saved with torch.save."""
    import subprocess

    d = tmp_path_factory.mktemp("fsdp2-one-rank")
    script = d / "train.py"
    script.write_text(FSDP2_ONE_RANK)
    norms_file, ckpt = d / "norms.json", d / "ckpt_rank0.pt"
    p = subprocess.run([sys.executable, "-c", HARNESS, str(script), str(norms_file), str(ckpt)],
                       capture_output=True, text=True, timeout=180, cwd=d,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), json.loads(norms_file.read_text()), ckpt


def test_fsdp2_device_row_path_reads_local_shards_and_the_full_norm(one_rank_fsdp2):
    """The reported crash: under FSDP2 the monitor's CUDA row path (device tensors copied to the
    host) raised 'aten.copy_.default got mixed torch.Tensor and DTensor' in _pre_step and the
    NaN/gradient watch went off. The same path on CPU (option nan_async_test), a 1-rank FSDP2
    model: no instrument error (the save audit's description of the DTensor state included),
    and the norms are clip_grad_norm_'s."""
    got, want, _ckpt = one_rank_fsdp2
    assert got["errors"] == [], got["errors"]
    assert len(got["norms"]) == len(want) == 4
    assert all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got["norms"], want)), (got, want)
    assert got["monitor"]["sharded_rows"] == 4


def test_per_rank_torch_save_of_fsdp2_state_is_read_as_tensors(one_rank_fsdp2):
    """torch.save(model.state_dict()) under FSDP2 pickles DTensors: the audit said
    ckpt-missing-model (error: 'no model weights found') and ckpt-unsafe-pickle (warning: 'save
    only tensors'), both false: the weights are each rank's shards, and torch.load(weights_only=
    True) accepts the DTensor classes once torch.distributed.tensor is imported."""
    rep = _audit(one_rank_fsdp2[2])
    got = {f.code: f for f in rep.findings}
    assert "ckpt-missing-model" not in got, [(f.code, f.title) for f in rep.findings]
    m = rep.metrics["checkpoint"]
    assert m["roles"]["model"]["tensors"] == 4 and m["roles"]["optimizer"][0]["states"] == 4
    f = got["ckpt-unsafe-pickle"]
    assert f.severity == "info" and "once torch.distributed.tensor is imported" in f.title
    assert "torch.distributed.tensor.DTensor" in f.evidence["dtensor_globals"]
