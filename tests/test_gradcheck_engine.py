"""The measuring side of gradcheck, in process: capture copies, the sub-problem, one call's check,
torch's returned-gradient errors classified, and the capture instrument on a fake harness context."""

from __future__ import annotations

import copy
import pickle
import time

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.gradcheck.capture import SampleBook, copy_call, signature  # noqa: E402
from torchdoctor.gradcheck.check import check_call  # noqa: E402
from torchdoctor.gradcheck.prepare import sub_problem  # noqa: E402
from torchdoctor.gradcheck.returns import classify  # noqa: E402


class MulSq(torch.autograd.Function):  # y = x * g**2; backward drops the 2 in g's gradient
    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return x * g * g

    @staticmethod
    def backward(ctx, go):
        x, g = ctx.saved_tensors
        return go * g * g, go * x * g


class Relu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, go):
        (x,) = ctx.saved_tensors
        return go * (x > 0)


class Sign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.sign(x)

    @staticmethod
    def backward(ctx, go):
        return go


class TanhF32Inside(torch.autograd.Function):  # correct, but computes in float32
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, go):
        (x,) = ctx.saved_tensors
        return go * (1 - torch.tanh(x) ** 2)


class HalfOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return (x * 2).float()

    @staticmethod
    def backward(ctx, go):
        return (go * 2).to(torch.float64)


class Noisy(torch.autograd.Function):  # dropout inside: fixed by re-seeding, so checkable
    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask * 2

    @staticmethod
    def backward(ctx, go):
        (mask,) = ctx.saved_tensors
        return go * mask * 2


class Few(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, go):
        return go


def rec(*args, requires=None):
    return {"args": list(args), "requires": requires or [True] * len(args), "device": "cpu"}


def check(fn, *args, requires=None):
    return check_call(torch, fn.apply, rec(*args, requires=requires), time.monotonic() + 60)


def test_dropped_factor_blames_only_the_wrong_input():
    torch.manual_seed(0)
    r = check(MulSq, torch.randn(64, 8), torch.rand(8) + 0.5)
    assert r["status"] == "checked" and r["reduced"] == {"dim0": [64, 16]}
    x_in, g_in = r["inputs"]
    assert x_in["confirmed"] == 0 and x_in["gradcheck"] == {"passed": True}
    assert g_in["confirmed"] == 8 and g_in["gradcheck"]["passed"] is False
    assert g_in["worst"]["numerical"] == pytest.approx(2 * g_in["worst"]["analytical"], rel=1e-6)


def test_relu_on_exact_zeros_gives_kinks_not_confirmed_differences():
    x = torch.relu(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)))
    r = check(Relu, x)
    (inp,) = r["inputs"]
    assert inp["kinks"] > 0 and inp["confirmed"] == 0


def test_sign_is_flat_and_varies():
    (inp,) = check(Sign, torch.randn(4, 8))["inputs"]
    assert inp["numerical_zero"] and inp["forward_varies"] is True and inp["confirmed"] > 0


def test_float32_inside_is_imprecise_not_confirmed():
    (inp,) = check(TanhF32Inside, torch.randn(4, 8))["inputs"]
    assert inp["confirmed"] == 0


def test_lower_precision_outputs_are_not_checked():
    r = check(HalfOut, torch.randn(4))
    assert r["status"] == "skipped" and "lower precision" in r["reason"]


def test_random_forward_is_checked_with_a_fixed_seed():
    r = check(Noisy, torch.randn(4, 8))
    assert r["status"] == "checked" and r["inputs"][0]["confirmed"] == 0


def test_wrong_number_of_gradients_is_classified():
    r = check(Few, torch.randn(3), torch.randn(3))
    assert r["status"] == "backward-error"
    assert r["returns"] == {"kind": "count", "node": "FewBackward", "expected": 2, "got": 1}


def test_the_users_tensors_are_not_touched():
    x, g = torch.randn(8, 4), torch.rand(4) + 0.5
    x0, g0 = x.clone(), g.clone()
    check(MulSq, x, g)
    assert torch.equal(x, x0) and torch.equal(g, g0) and x.dtype == torch.float32


def test_returns_classify_the_texts_torch_raises():
    class Shape(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, go):
            return go.sum(0)

    class NonTensor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

        @staticmethod
        def backward(ctx, go):
            return go, go

    got = []
    for f, args in ((Shape, (torch.randn(4, 3, requires_grad=True),)),
                    (NonTensor, (torch.randn(3, requires_grad=True), 2.0))):
        with pytest.raises(RuntimeError) as e:
            f.apply(*args).sum().backward()
        got.append(classify(str(e.value)))
    assert got[0] == {"kind": "shape", "node": "ShapeBackward", "index": 0, "got": "[3]",
                      "expected": "[4, 3]"}
    assert got[1] == {"kind": "not-a-tensor", "node": "NonTensorBackward", "position": 2}
    assert classify("expected scalar type Float but found Double") is None


def test_sub_problem_slices_the_shared_leading_dim_only():
    x, w, b = torch.randn(64, 8), torch.randn(8, 8), torch.randn(64)
    out, red = sub_problem(torch, [x, w, b], [0, 1])
    assert red == {"dim0": [64, 16]} and out[0].shape == (16, 8) and out[1].shape == (8, 8)
    assert out[2].shape == (16,)
    small, none = sub_problem(torch, [torch.randn(4, 4)], [0])
    assert none is None and small[0].shape == (4, 4)


def test_copy_is_detached_on_the_host_and_bounded():
    x = torch.randn(4, 3, requires_grad=True) * 1
    c = copy_call(torch, (x, 2.0, [torch.ones(2)]), room=10**9)
    assert not c["args"][0].requires_grad and c["args"][0].grad_fn is None and c["reduced"] is None
    assert c["args"][1] == 2.0 and torch.equal(c["args"][2][0], torch.ones(2))
    big = torch.randn(1000, 100, requires_grad=True)
    c = copy_call(torch, (big,), room=100_000)
    assert c["reduced"]["dim0"][0] == 1000 and c["args"][0].numel() * 4 <= 100_000


def test_the_book_prefers_distinct_shapes():
    book = SampleBook(samples=2)
    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    for t in (a, a, b):
        sig = signature(torch, (t,))
        where = book.wants("F", sig)
        if where is not None:
            book.put("F", where, {"sig": sig, "bytes": 1})
    assert [k["sig"][0][0] for k in book.kept["F"]] == [(2, 3), (5, 3)]
    assert book.wants("F", signature(torch, (a,))) is None


def gradcheck_ctx(**options):
    """The recording context of a ``gradcheck`` run with a 60 s timeout and a 20 s budget."""
    from torchdoctor.instruments.testing import RecordingContext

    return RecordingContext("gradcheck", {"timeout": 60, "budget": 20, **options})


class Dirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        return x

    @staticmethod
    def backward(ctx, go):
        return go * 2


class Marked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, go):
        return go * 2


class Stash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.exp()
        ctx.out = out
        ctx.n = 3
        return out

    @staticmethod
    def backward(ctx, go):
        return go * ctx.out


def test_the_instrument_captures_watches_checks_and_leaves_nothing_behind():
    from torchdoctor.instruments.training.autograd_capture import AutogradCapture

    raw = vars(torch.autograd.Function)["apply"]
    inst, ctx = AutogradCapture(), gradcheck_ctx()
    inst.install(ctx)
    try:
        w = torch.randn(4, requires_grad=True)
        for _ in range(4):
            y = Dirty.apply(w * 1) + Marked.apply(w * 1) + Stash.apply(w)
            MulSq.apply(y.unsqueeze(0).repeat(3, 1), w).sum().backward()
        with torch.no_grad():
            MulSq.apply(torch.ones(2, 4), torch.ones(4))  # no graph: not sampled
        net = torch.nn.Linear(4, 1)
        copy.deepcopy(net), pickle.dumps(net)
    finally:
        inst.uninstall(ctx)
    assert vars(torch.autograd.Function)["apply"] is raw
    fns = {e["function"]: e for e in ctx.of("autograd_function")}
    assert fns["MulSq"]["calls"] == 5 and fns["MulSq"]["graph_calls"] == 4 and fns["MulSq"]["sampled"] == 3
    assert fns["MulSq"]["inputs"] == ["x", "g"] and fns["MulSq"]["backward_at"].endswith(":27")
    assert [e["function"] for e in ctx.of("autograd_dirty")] == ["Dirty"]
    (stash,) = ctx.of("autograd_ctx_tensors")
    assert stash["function"] == "Stash" and stash["attrs"][0]["name"] == "out"
    assert stash["attrs"][0]["role"] == "output 0"
    calls = [c for c in ctx.of("gradcheck_call") if c["function"] == "MulSq"]
    assert len(calls) == 3 and all(c["status"] == "checked" for c in calls)
    assert all(c["call_site"] and c["call_site"].endswith(".py:" + c["call_site"].rsplit(":")[-1])
               for c in calls)
    assert all(c["inputs"][1]["confirmed"] > 0 and c["inputs"][0]["confirmed"] == 0 for c in calls)
    assert ctx.of("gradcheck_summary")[0]["checked"] >= 3


class Chatty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("forward of Chatty")
        return x * 3

    @staticmethod
    def backward(ctx, go):
        return go * 3


def test_the_checks_replays_do_not_flood_the_scripts_output(capsys):
    from torchdoctor.instruments.training.autograd_capture import AutogradCapture

    inst, ctx = AutogradCapture(), gradcheck_ctx(samples=1)
    inst.install(ctx)
    try:
        Chatty.apply(torch.randn(3, requires_grad=True)).sum().backward()
    finally:
        inst.uninstall(ctx)
    assert capsys.readouterr().out.count("forward of Chatty") == 1  # the script's own call only
    (summary,) = ctx.of("gradcheck_summary")
    assert summary["checked"] == 1 and summary["output_dropped"] > 10


@pytest.mark.gpu
def test_a_cuda_call_is_copied_to_the_host_and_checked_on_its_device():
    from torchdoctor.instruments.training.autograd_capture import AutogradCapture

    inst, ctx = AutogradCapture(), gradcheck_ctx(samples=1)
    inst.install(ctx)
    try:
        x = torch.randn(64, 8, device="cuda", requires_grad=True)  # both inputs checked
        g = (torch.rand(8, device="cuda") + 0.5).requires_grad_()
        MulSq.apply(x, g).sum().backward()
        (kept,) = next(iter(inst.book.kept.values()))
        assert kept["args"][0].device.type == "cpu" and kept["device"].startswith("cuda")
    finally:
        inst.uninstall(ctx)
    (c,) = ctx.of("gradcheck_call")
    assert c["status"] == "checked" and c["device"].startswith("cuda")
    assert c["inputs"][1]["confirmed"] > 0 and c["inputs"][0]["confirmed"] == 0


def test_training_is_bit_identical_under_the_capture():
    from torchdoctor.instruments.training.autograd_capture import AutogradCapture

    def train():
        torch.manual_seed(3)
        w = torch.randn(8, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(5):
            x = torch.randn(16, 8)
            loss = Sign.apply(MulSq.apply(x, w)).sum() + MulSq.apply(x, w).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return w.detach().clone()

    plain = train(), torch.randn(3)
    inst, ctx = AutogradCapture(), gradcheck_ctx(samples=1)
    inst.install(ctx)
    try:
        w = train()
    finally:
        inst.uninstall(ctx)  # the checks run here: they leave the RNG stream as it was
    under = w, torch.randn(3)
    assert torch.equal(plain[0], under[0]) and torch.equal(plain[1], under[1])
    assert len(ctx.of("gradcheck_call")) == 2


def test_meta_tensors_are_not_sampled_and_do_not_break_the_capture():
    from torchdoctor.instruments.training.autograd_capture import AutogradCapture

    inst, ctx = AutogradCapture(), gradcheck_ctx(samples=1)
    inst.install(ctx)
    try:
        Relu.apply(torch.randn(4, device="meta", requires_grad=True))
        Relu.apply(torch.randn(4, requires_grad=True)).sum().backward()
    finally:
        inst.uninstall(ctx)
    assert not ctx.of("instrument_error")
    (fn,) = ctx.of("autograd_function")
    assert fn["calls"] == 2 and fn["sampled"] == 1 and "meta tensor" in next(iter(fn["skipped"]))


def test_inference_mode_and_inference_tensors_are_left_alone():
    from torchdoctor.instruments.training.autograd_capture import AutogradCapture

    inst, ctx = AutogradCapture(), gradcheck_ctx(samples=1)
    inst.install(ctx)
    try:
        with torch.inference_mode():
            frozen = torch.randn(4)
            Dirty.apply(frozen)
        Relu.apply(frozen * 1)
    finally:
        inst.uninstall(ctx)
    assert not ctx.of("instrument_error") and not ctx.of("autograd_dirty")
