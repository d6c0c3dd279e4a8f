"""The FLOP counter instrument (instruments/perf/flop_count.py), in process on CPU: exact counts, no
change to the numbers the script computes (autocast, a custom autograd Function, dropout,
attention, norms), one step counted and left out of the step statistics, and no count under
torch.compile."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.instruments.perf.flop_count import FlopCount, _Tally, make_counter, plan_step  # noqa: E402
from torchdoctor.instruments.testing import RecordingContext  # noqa: E402


class MatMul(torch.autograd.Function):
    """A custom Function whose backward does its own matmuls (counted by the dispatch mode)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g


class Net(torch.nn.Module):
    """Conv, batch norm, layer norm, attention, dropout, GELU, an embedding and a custom Function."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm1d(16)
        self.ln = torch.nn.LayerNorm(16)
        self.drop = torch.nn.Dropout(0.1)
        self.w = torch.nn.Parameter(torch.randn(16, 16) * 0.1)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, tok):
        h = self.emb(tok)  # (B, T, 16)
        h = self.bn(self.conv(h.transpose(1, 2))).transpose(1, 2)
        h = self.ln(torch.nn.functional.gelu(h))
        h = torch.nn.functional.scaled_dot_product_attention(h, h, h)
        h = self.drop(h)
        h = MatMul.apply(h.reshape(-1, 16), self.w).reshape(h.shape)
        return self.head(h.mean(1))


def _train(count_step: int | None, autocast: bool, steps: int = 4):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    tally = _Tally()
    losses = []
    for s in range(1, steps + 1):
        counter = make_counter(tally) if s == count_step else None
        if counter is not None:
            counter.__enter__()
        tok = torch.randint(0, 50, (4, 7))
        y = torch.randint(0, 5, (4,))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(net(tok), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if counter is not None:
            counter.__exit__(None, None, None)
        losses.append(loss.detach().clone())
    return net, losses, tally, torch.get_rng_state()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_counting_a_step_changes_no_number_the_script_computes(autocast):
    """Same seeds, one run with step 3 counted: every loss, parameter and the RNG state are
    bitwise the same (the counter reads shapes; dropout draws the same numbers)."""
    plain, l0, _, rng0 = _train(None, autocast)
    counted, l1, tally, rng1 = _train(3, autocast)
    assert all(torch.equal(a, b) for a, b in zip(l0, l1))
    for (n, a), (_, b) in zip(plain.named_parameters(), counted.named_parameters()):
        assert torch.equal(a, b), n
    assert torch.equal(rng0, rng1)
    by = tally.by_dev["cpu"]
    assert sum(by.values()) > 0 and tally.errors == []
    if autocast:  # the matmuls ran in bf16 under autocast: counted as bf16
        assert by.get("bf16", 0) > 0
    else:
        assert set(by) == {"fp32"}
    assert {"bmm", "mm", "convolution", "convolution_backward"} <= set(tally.by_op) or \
        {"mm", "convolution"} <= set(tally.by_op)


def test_an_mlp_step_is_counted_exactly():
    """Linear 64->128 and 128->10, batch 32, input without grad: forward 2BIO per layer; backward
    2BIO for the weight, 2BIO for the input grad of the second layer only."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    tally = _Tally()
    c = make_counter(tally)
    with c:
        torch.nn.functional.cross_entropy(m(torch.randn(32, 64)), torch.randint(0, 10, (32,))).backward()
    l1, l2 = 2 * 32 * 64 * 128, 2 * 32 * 128 * 10
    assert c.get_total_flops() == 2 * l1 + 3 * l2 == tally.by_dev["cpu"]["fp32"]


def test_a_custom_functions_backward_is_counted():
    tally = _Tally()
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 4, requires_grad=True)
    with make_counter(tally) as c:
        MatMul.apply(x, w).sum().backward()
    assert c.get_total_flops() == 3 * (2 * 8 * 16 * 4)  # forward mm + the two in backward


def test_the_counter_installs_no_module_hook():
    """torch's module tracker registers global forward hooks and gradient hooks: replaced."""
    from torch.nn.modules import module as mod

    before = (len(mod._global_forward_pre_hooks), len(mod._global_forward_hooks))
    with make_counter(_Tally()):
        assert (len(mod._global_forward_pre_hooks), len(mod._global_forward_hooks)) == before


def _drive(ctx, inst, model, opt, steps):
    for s in range(1, steps + 1):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        inst.on_step_end(ctx, s)


def test_the_instrument_counts_step_two_only(monkeypatch):
    # the process may hold graphs another in-process test compiled (the full suite did): the
    # counter then rightly skips; this test is about a process without any
    import torchdoctor.torch_internals as ti

    monkeypatch.setattr(ti, "dynamo_graphs_compiled", lambda: 0)
    ctx = RecordingContext("checkup", {"steps": 6})
    inst = FlopCount()
    inst.install(ctx)
    m = torch.nn.Linear(8, 3)
    _drive(ctx, inst, m, torch.optim.SGD(m.parameters(), lr=0.1), 6)
    inst.uninstall(ctx)
    (ev,) = ctx.of("flops")
    assert ev["status"] == "ok" and ev["counted_step"] == 2 and ev["entered"]
    assert ev["flops"] == 2 * (2 * 4 * 8 * 3)  # forward addmm + weight grad (input has no grad)
    assert ev["device"] == "cpu" and ev["flops_by_dtype"] == {"fp32": ev["flops"]}


def test_under_torch_compile_nothing_is_counted_and_the_model_still_trains():
    """Compiled kernels run outside the dispatcher: no count (absent with the reason), no mode."""
    from torchdoctor.torch_internals import current_dispatch_mode

    ctx = RecordingContext("checkup", {"steps": 5})
    inst = FlopCount()
    inst.install(ctx)
    m = torch.nn.Linear(8, 3)
    cm = torch.compile(m, backend="eager")
    try:
        _drive(ctx, inst, cm, torch.optim.SGD(m.parameters(), lr=0.1), 5)
        inst.uninstall(ctx)
    finally:
        from torch._dynamo.utils import counters

        counters.clear()  # the other tests of this process did not compile
    (ev,) = ctx.of("flops")
    assert ev["status"] == "skipped" and "torch.compile" in ev["reason"] and not ev["entered"]
    assert current_dispatch_mode() is None


def test_a_model_set_to_compile_that_has_not_compiled_yet_is_not_counted(monkeypatch):
    # treat's compile trial calls model.compile() at the first forward, so the first compiled
    # call is step 2, the counted step: under the counter's dispatch mode torch 2.11's dynamo
    # compiled no graph and llm.c ran eager for the whole trial ("noise, 1.00x"; plain: 2.2x)
    import torchdoctor.torch_internals as ti

    monkeypatch.setattr(ti, "dynamo_graphs_compiled", lambda: 0)
    import torchdoctor.instruments.dynamo._counts as dc

    monkeypatch.setattr(dc, "dynamo_counts", lambda: {"frames": 0, "frames_ok": 0, "graphs": 0,
                                                      "ops_captured": 0, "graph_breaks": 0})
    m = torch.nn.Linear(8, 3)
    ctx = RecordingContext("checkup", {"steps": 4}, models=(m,))
    m.compile(backend="eager")
    inst = FlopCount()
    inst.install(ctx)
    try:
        _drive(ctx, inst, m, torch.optim.SGD(m.parameters(), lr=0.1), 4)
        inst.uninstall(ctx)
    finally:
        m._compiled_call_impl = None
        from torch._dynamo.utils import counters

        counters.clear()
    (ev,) = ctx.of("flops")
    assert ev["status"] == "skipped" and not ev["entered"]
    assert ev["reason"].startswith("Linear is set to compile and has not compiled yet")


def test_a_run_that_ends_inside_the_counted_step_leaves_no_mode_behind():
    from torchdoctor.torch_internals import current_dispatch_mode

    ctx = RecordingContext("checkup", {"steps": 0})
    inst = FlopCount()
    inst.install(ctx)
    inst.on_step_end(ctx, 1)  # enters for step 2
    assert current_dispatch_mode() is not None
    inst.uninstall(ctx)  # the script crashed or ended in step 2
    assert current_dispatch_mode() is None
    (ev,) = ctx.of("flops")
    assert ev["status"] == "not-reached" and "inside step 2" in ev["reason"]


def test_a_mode_of_the_script_above_the_counter_is_never_popped():
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchdoctor.torch_internals import current_dispatch_mode

    class Theirs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    ctx = RecordingContext("checkup", {"steps": 0})
    inst = FlopCount()
    inst.install(ctx)
    inst.on_step_end(ctx, 1)
    theirs = Theirs()
    theirs.__enter__()
    inst.on_step_end(ctx, 2)  # not on top: left in place
    assert current_dispatch_mode() is theirs
    theirs.__exit__(None, None, None)
    inst.on_step_end(ctx, 3)  # on top again: left, but at the wrong step: no figure
    assert current_dispatch_mode() is None
    (ev,) = ctx.of("flops")
    assert ev["status"] == "skipped" and "step 3" in ev["reason"]


@pytest.mark.parametrize("options, profiled, want", [
    ({"steps": 20}, False, 2),
    ({"steps": 20}, True, 2),  # the window takes steps 5..10 (wait 5, warm-up 1, 3 active)
    ({"steps": 20, "profile_skip": 1}, True, 7),  # window 1..6
    ({"steps": 0}, False, 2),
    ({"steps": 2}, False, None),  # step 2 is the last: nothing left to count
    ({"steps": 5}, True, None),  # the window fills the run
])
def test_the_counted_step_avoids_the_warm_up_and_the_profiler_window(options, profiled, want):
    step, why = plan_step(options, profiled)
    assert step == want
    assert (why is None) == (want is not None)



def test_a_ddp_step_is_counted_and_unchanged(tmp_path):
    """DDP (gloo, one rank, in this process): its gradient all-reduce passes through the mode
    uncounted; the rank's own matmuls are counted exactly and the parameters come out bitwise the same."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        def run(count):
            torch.manual_seed(0)
            m = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            n = None
            for s in range(1, 5):
                c = make_counter(_Tally()) if s == count else None
                if c is not None:
                    c.__enter__()
                loss = m(torch.randn(8, 16)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if c is not None:
                    c.__exit__(None, None, None)
                    n = c.get_total_flops()
            return [p.detach().clone() for p in m.parameters()], n

        a, _ = run(None)
        b, n = run(3)
    finally:
        dist.destroy_process_group()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert n == 2 * (2 * 8 * 16 * 32) + 3 * (2 * 8 * 32 * 4)
