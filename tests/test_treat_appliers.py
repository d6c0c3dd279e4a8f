"""treat's appliers in-process on CPU: each applies its stated change, notes the user's line, and
leaves nothing behind on uninstall (do no harm). The treatment instrument is driven by hand."""

from __future__ import annotations

import copy
import inspect
import os

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset, IterableDataset  # noqa: E402

from torchdoctor.instruments.testing import RecordingContext  # noqa: E402
from torchdoctor.instruments.trials.treatment import Treatment  # noqa: E402

HERE = os.path.abspath(__file__)


def treat_ctx(*names: str, value: str | None = None) -> RecordingContext:
    """The recording context of a ``treat`` trial applying the treatments ``names``."""
    return RecordingContext("run", {"treatment": [{"name": n, "value": value} for n in names]})


def _line(marker: str) -> str:
    src = inspect.getsource(inspect.getmodule(_line)).splitlines()
    n = next(i for i, s in enumerate(src, 1) if marker in s and "_line(" not in s)
    return f"{HERE}:{n}"


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2,), float(i))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


def _run(ctx: Ctx, body) -> Treatment:
    inst = Treatment()
    inst.install(ctx)
    try:
        body(inst)
    finally:
        inst.uninstall(ctx)
    return inst


def _applied(ctx: Ctx, name: str) -> dict:
    return next(a for a in ctx.last("treatment")["applied"] if a["name"] == name)


def test_workers_rebuild_map_style_loaders_and_leave_iterable_ones(tmp_path):
    orig = DataLoader.__init__
    ctx = treat_ctx("dataloader-workers", value="2")
    got = {}

    def body(inst):
        got["dl"] = DataLoader(Squares(), batch_size=4)  # marker: build-loader
        got["it"] = DataLoader(Stream(), batch_size=2)

    _run(ctx, body)
    assert (got["dl"].num_workers, got["dl"].persistent_workers, got["dl"].prefetch_factor) == (2, True, 2)
    assert got["it"].num_workers == 0
    a = _applied(ctx, "dataloader-workers")
    assert a["changes"] == [{"what": "DataLoader", "where": _line("marker: build-loader"),
                             "code": "DataLoader(..., num_workers=2, persistent_workers=True, prefetch_factor=2)"}]
    assert "IterableDataset" in a["notes"][0]
    assert DataLoader.__init__ is orig
    assert DataLoader(Squares()).num_workers == 0  # after uninstall: as the script asks


def test_set_to_none_only_where_the_script_asked_for_zeros():
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = treat_ctx("set-to-none")
    _run(ctx, lambda inst: opt.zero_grad(set_to_none=False))  # marker: zero-grad
    assert model.weight.grad is None
    assert _applied(ctx, "set-to-none")["changes"][0]["where"] == _line("marker: zero-grad")
    model(torch.ones(1, 2)).sum().backward()
    opt.zero_grad(set_to_none=False)  # after uninstall: zeros, as asked
    assert model.weight.grad is not None and not model.weight.grad.any()


def test_fused_optimizer_on_a_generator_of_parameters_and_restored_after():
    model = torch.nn.Linear(2, 1)
    orig = torch.optim.AdamW.__init__
    ctx = treat_ctx("fused-optimizer")
    got = {}
    _run(ctx, lambda inst: got.setdefault("opt", torch.optim.AdamW(model.parameters(), lr=1e-3)))
    opt = got["opt"]
    assert opt.defaults["fused"] is True and len(opt.param_groups[0]["params"]) == 2
    assert _applied(ctx, "fused-optimizer")["changes"][0]["code"] == "torch.optim.AdamW(..., fused=True)"
    assert torch.optim.AdamW.__init__ is orig
    assert not torch.optim.AdamW(model.parameters()).defaults.get("fused")


def test_channels_last_converts_the_conv_model_and_its_inputs_then_converts_back():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    seen = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)
                                                                and not a[0].is_contiguous()))
    keys = list(model.state_dict())
    ctx = treat_ctx("channels-last")

    def body(inst):
        model(torch.randn(2, 3, 8, 8))
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert not model[0].weight.is_contiguous()

    _run(ctx, body)
    assert seen == [True] and list(model.state_dict()) == keys
    assert model[0].weight.is_contiguous()
    model(torch.randn(2, 3, 8, 8))
    assert seen == [True, False]  # hooks gone: the input is left as it is


def test_bf16_autocast_covers_forward_and_loss_but_not_backward_or_the_step():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    during_step = []
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    ctx = treat_ctx("bf16-autocast")
    hooks = []

    def body(inst):  # a step pre hook registered after the treatment's (as the script's would be)
        hooks.append(register_optimizer_step_pre_hook(
            lambda o, a, k: during_step.append(torch.is_autocast_enabled("cpu"))))
        out = model(torch.randn(2, 4))
        assert out.dtype == torch.bfloat16 and torch.is_autocast_enabled("cpu")
        inst.on_backward_begin(ctx)
        assert not torch.is_autocast_enabled("cpu")
        out.float().sum().backward()
        inst.on_backward_end(ctx)
        assert torch.is_autocast_enabled("cpu")
        opt.step()
        assert torch.is_autocast_enabled("cpu")

    try:
        _run(ctx, body)
    finally:
        for h in hooks:
            h.remove()
    assert during_step == [False]
    assert not torch.is_autocast_enabled("cpu")
    assert model(torch.randn(2, 4)).dtype == torch.float32


def test_compile_in_place_keeps_state_dict_keys_and_deepcopy_and_is_undone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    keys = list(model.state_dict())
    ctx = treat_ctx("compile", value="eager")

    def body(inst):
        model(torch.randn(2, 4))
        assert model._compiled_call_impl is not None
        assert list(model.state_dict()) == keys
        clone = copy.deepcopy(model)
        assert clone._compiled_call_impl is None

    _run(ctx, body)
    assert model._compiled_call_impl is None
    assert _applied(ctx, "compile")["changes"][0]["code"].startswith("model.compile(backend='eager')")


def test_flags_are_set_for_the_run_and_restored():
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)
    ctx = treat_ctx("tf32", "cudnn-benchmark")

    def body(inst):
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark

    _run(ctx, body)
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark) == before


def test_a_treatment_that_cannot_apply_is_reported_and_the_others_still_apply(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    ctx = treat_ctx("expandable-segments", "set-to-none")
    _run(ctx, lambda inst: None)
    err = ctx.last("treatment_error")
    assert err["name"] == "expandable-segments" and "does not hold" in err["error"]
    assert [a["name"] for a in ctx.last("treatment")["applied"]] == ["set-to-none"]


def test_the_survey_sees_loaders_optimizers_zero_grad_and_models():
    ctx = treat_ctx()

    def body(inst):
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten())
        opt = torch.optim.Adam(model.parameters())
        DataLoader(Squares(), batch_size=2)
        model(torch.randn(1, 1, 5, 5))
        opt.zero_grad(set_to_none=False)
        inst.on_step_end(ctx, 1)

    _run(ctx, body)
    s = ctx.last("treat_survey")
    assert [(d["num_workers"], d["pin_memory"], d["iterable"]) for d in s["loaders"]] == [(0, False, False)]
    assert [(o["cls"], o["fused"]) for o in s["optimizers"]] == [("Adam", None)]
    assert len(s["zero_grad_false"]) == 1 and s["zero_grad_false"][0].startswith(HERE + ":")
    m = s["models"][0]
    assert (m["cls"], m["has_conv"], m["dtypes"], m["autocast"]) == ("Sequential", True, ["float32"], False)
    assert s["flags"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
