"""Instruments never touch the storage of tensors of layouts they do not read (issue 27 item 2).

gcn's unmodified script died under ``memory`` with "Cannot access storage of SparseTensorImpl":
the saved-tensor hook read the storage of the sparse adjacency that ``torch.spmm`` saves for
backward. Each measuring piece that reads storages or values is driven here on sparse COO/CSR,
nested, meta and quantized tensors; the end-to-end run of the sparse fixture under every probe
is the fixture ``tests/fixtures/scripts/memory/sparse_graph.py`` (``memory``) and
``test_sparse_graph_runs_unharmed_under_every_probe`` below.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.memory.layouts import Skipped, unsupported  # noqa: E402


def _kinds():
    warnings.simplefilter("ignore")
    i = torch.tensor([[0, 1, 2], [1, 0, 2]])
    coo = torch.sparse_coo_tensor(i, torch.ones(3), (3, 3)).coalesce()
    return {
        "sparse_coo": coo,
        "sparse_csr": coo.to_sparse_csr(),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "meta": torch.empty(4, device="meta"),
        "quantized": torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
    }


def test_each_unsupported_kind_is_named_and_dense_tensors_pass():
    for kind, t in _kinds().items():
        assert unsupported(t) == kind
    assert unsupported(torch.ones(3)) is None
    assert unsupported(torch.nn.Parameter(torch.ones(3))) is None
    sk = Skipped()
    assert [sk.check(t) for t in _kinds().values()] == [False] * 5
    assert sk.check(torch.ones(2)) and sk.as_dict() == {k: 1 for k in _kinds()}


def test_saved_tensor_hook_leaves_a_sparse_tensor_saved_for_backward_alone():
    from torchdoctor.memory.saved import SavedTensors

    adj = _kinds()["sparse_coo"]
    w = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(3, 3)
    saved = SavedTensors()
    assert saved.install()
    try:
        out = torch.spmm(adj, x @ w)  # saves the sparse adjacency for backward
        out.sum().backward()
    finally:
        saved.uninstall()
    ref = torch.spmm(adj, x).sum(0)  # d/dw of sum(adj @ x @ w) = (adj @ x)^T 1
    assert torch.allclose(w.grad, ref.unsqueeze(1).expand(3, 2))
    assert saved.skipped.as_dict().get("sparse_coo", 0) >= 1


def test_dispatch_tracker_skips_sparse_ops_outputs_and_inputs():
    from torchdoctor.memory.sites import DispatchTracker

    tr = DispatchTracker()
    tr._record_one(_kinds()["sparse_coo"])
    tr._record_input(_kinds()["sparse_csr"])
    tr._record_one(_kinds()["nested"])
    assert tr.skipped.as_dict() == {"sparse_coo": 1, "sparse_csr": 1, "nested": 1}
    assert tr.live_cpu_bytes() == 0


def test_fingerprints_skip_what_they_cannot_read_and_chunk_large_tensors(monkeypatch):
    from torchdoctor.instruments.repro import fingerprint_reduce as fr

    for t in _kinds().values():
        assert fr.reduce3(torch, t) is None
    x = torch.randn(1000, dtype=torch.float32)
    whole = fr.reduce3(torch, x)
    monkeypatch.setattr(fr, "CHUNK", 64)  # the same numbers, 64 elements at a time
    chunked = fr.reduce3(torch, x)
    assert torch.allclose(whole, chunked, rtol=1e-12, atol=1e-9)
    assert chunked[2].item() == pytest.approx(x.double()[::fr.STRIDE].sum().item(), rel=1e-12)


def test_memory_accounting_and_tensor_scan_skip_sparse():
    from torchdoctor.memory.tensors import other_tensor_bytes, storage_key

    kinds = _kinds()  # alive during the scan
    assert storage_key(kinds["sparse_coo"]) is None
    other_tensor_bytes(set(), cuda=False)  # never raises on the sparse tensors alive


@pytest.mark.parametrize("engine", ["dispatch", "debug_mode"])
def test_the_op_trace_runs_a_sparse_op_and_counts_what_it_did_not_read(engine):
    """repro's localising run traces every op: the sparse adjacency of ``torch.spmm`` reached the
    fingerprint (``reshape`` of a sparse tensor raises) inside the user's op."""
    from torchdoctor.instruments.repro.fingerprint_ops import FingerprintOps
    from torchdoctor.instruments.testing import RecordingContext
    from torchdoctor.torch_internals import debug_mode_class

    if engine == "debug_mode" and debug_mode_class() is None:
        pytest.skip("no DebugMode with tensor hashes in this torch")

    ctx = RecordingContext("repro", {"repro_ops": {"step": 1, "engine": engine}})
    inst = FingerprintOps()
    inst.install(ctx)
    try:
        w = torch.randn(3, 2, requires_grad=True)
        torch.spmm(_kinds()["sparse_coo"], torch.randn(3, 3) @ w).sum().backward()
    finally:
        inst.uninstall(ctx)
    ev = ctx.last("op_trace")
    assert ev["ops"] and ev["skipped_layouts"].get("sparse_coo", 0) >= 1
    assert w.grad is not None
