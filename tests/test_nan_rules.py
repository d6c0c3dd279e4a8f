"""Unit tests of the numerics and training-bug rules on synthetic evidence (no child, no torch)."""

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.judge import NotApplicable
from torchdoctor.rules import grad_scale as G
from torchdoctor.rules import numerics as N
from torchdoctor.rules import training as T


def ev(*events, meta=None):
    return Evidence.from_events([{"kind": k, **d} for k, d in events], meta=meta or {"probe": "nan"})


def series(norms, opt=0, start=1):
    steps = list(range(start, start + len(norms)))
    return ("numerics", {"steps": steps, "opt": [opt] * len(norms), "loss": [1.0] * len(norms),
                         "grad_norm": norms})


# ---------------------------------------------------------------------------- explosion
def test_explosion_geometric_growth_is_found_with_onset():
    norms = [(i + 1, 1.0 * 3 ** i) for i in range(12)]
    out = G.judge_explosion(norms)
    assert out is not None
    assert out["max_step"] == 12
    assert out["above_10x_from_step"] is not None and out["above_10x_from_step"] <= 6


def test_healthy_noisy_decreasing_norms_are_not_an_explosion():
    import random

    rng = random.Random(0)
    norms = [(i + 1, (5.0 / (1 + i / 10)) * rng.uniform(0.5, 2.0)) for i in range(200)]
    assert G.judge_explosion(norms) is None


def test_single_spike_is_found():
    norms = [(i + 1, 1.0 + 0.1 * (i % 3)) for i in range(30)]
    norms[20] = (21, 500.0)
    out = G.judge_explosion(norms)
    assert out is not None and "spike" in out and out["spike"].startswith("step 21")


def test_ten_x_wobble_is_not_a_spike():
    norms = [(i + 1, 1.0 if i % 7 else 10.0) for i in range(40)]
    assert G.judge_explosion(norms) is None


def test_too_few_norms_is_not_judged():
    assert G.judge_explosion([(1, 1.0), (2, 1e6)]) is None
    with pytest.raises(NotApplicable):
        G.gradient_explosion(ev(series([1.0, 2.0, 3.0]), ("nan_monitor", {})))


def test_explosion_stops_at_first_nonfinite_and_reports_it():
    norms = [1.0, 1.1, 0.9, 1.0, 50.0, 2000.0, 9e4, "inf", "nan"]
    out = G.gradient_explosion(ev(series(norms), ("nan_monitor", {})))
    assert [f.code for f in out] == ["gradient-explosion"]
    assert out[0].evidence["nonfinite_from_step"] == 8


def test_explosion_per_optimizer():
    e = ev(series([1.0] * 10, opt=0), series([1.0, 1, 1, 1, 10, 100, 1e3, 1e4, 1e5, 1e6], opt=1),
           ("nan_monitor", {}))
    out = G.gradient_explosion(e)
    assert len(out) == 1 and out[0].evidence["optimizer"] == 1


def test_norm_overflow_event_alone_is_an_explosion():
    out = G.gradient_explosion(ev(("grad_norm_overflow", {"step": 4, "norm": 3e20}), ("nan_monitor", {})))
    assert out and "3e+20" in out[0].title


# ---------------------------------------------------------------------------- non-finite
FWD = {"what": "forward", "step": 6, "module": "model.0", "module_class": "Standardize",
       "call": 0, "outputs": [{"index": 0, "minmax": ["nan", "nan"]}],
       "inputs": [{"index": 0, "minmax": [0.1, 1.0]}], "output_index": 0, "forward_watch": True,
       "forward_source": "train.py:14", "grad_enabled": True, "nonfinite_params": []}


def test_nonfinite_forward_title_names_module_step_and_kind():
    (f,) = N.nonfinite(ev(("nonfinite", FWD)))
    assert f.code == "nonfinite-forward" and f.severity == "error"
    assert "step 6" in f.title and "model.0 (Standardize)" in f.title and "NaN" in f.title
    assert f.evidence["forward_source"] == "train.py:14"
    assert f.evidence["inputs"] == ["#0 min/max [0.1, 1.0]"]


def test_nonfinite_forward_with_broken_weights_says_so():
    (f,) = N.nonfinite(ev(("nonfinite", {**FWD, "nonfinite_params": ["model.0.weight"],
                                         "outputs": [{"index": 0, "minmax": ["-inf", 3.0]}]})))
    assert "weights were already non-finite" in f.title and "Inf" in f.title
    assert f.fix.startswith("if the module's weights")


def test_nonfinite_between_children_names_the_parent():
    nf = {**FWD, "module": "net", "module_class": "Net", "between_children": True,
          "receiver": {"module": "net.fc2", "module_class": "Linear", "input_index": 0,
                       "minmax": ["-inf", 2.0]}}
    (f,) = N.nonfinite(ev(("nonfinite", nf)))
    assert "net (Net)'s own forward code" in f.title and "Inf" in f.title
    assert "net.fc2 (Linear)" in f.evidence["made_between_children"]


def test_nonfinite_input_blames_the_data():
    nf = {"what": "input", "step": 4, "module": "model", "module_class": "Sequential",
          "receiver": {"module": "model", "module_class": "Sequential", "input_index": 0,
                       "minmax": ["nan", "nan"]}, "inputs": [], "forward_watch": True}
    (f,) = N.nonfinite(ev(("nonfinite", nf)))
    assert f.code == "nonfinite-forward" and "the data" in f.title and "step 4" in f.title


def test_nonfinite_loss_watched_and_unwatched():
    nf = {"what": "loss", "step": 4, "loss": ["nan"], "forward_watch": True}
    (f,) = N.nonfinite(ev(("nonfinite", nf)))
    assert f.code == "nonfinite-loss" and "every module output was finite" in f.title
    (g,) = N.nonfinite(ev(("nonfinite", {**nf, "forward_watch": False, "loss": ["inf"]}),
                          meta={"probe": "checkup"}))
    assert "torchdoctor nan" in g.title and "Inf" in g.title
    (h,) = N.nonfinite(ev(("nonfinite", {**nf, "forward_watch": False})))
    assert "re-run" in h.title


def test_nonfinite_gradient():
    nf = {"what": "gradient", "step": 5, "param": "enc.2.bias", "param_shape": [4],
          "grad_norm": "nan", "bad_params": ["enc.2.bias", "enc.2.weight"], "bad_count": 2,
          "params_with_grad": 4, "order": "backward", "forward_watch": True, "losses": [{}],
          "grad_stats": {"shape": [4], "dtype": "float32", "nan": 4, "inf": 0, "-inf": 0,
                         "min": None, "max": None, "mean": None}}
    (f,) = N.nonfinite(ev(("nonfinite", nf)))
    assert f.code == "nonfinite-gradient" and "enc.2.bias" in f.title and "NaN" in f.title
    assert f.evidence["also"] == ["enc.2.weight"]


def test_no_nonfinite_is_healthy_but_needs_steps():
    assert N.nonfinite(ev(series([1.0, 1.0]), ("nan_monitor", {}))) == []
    with pytest.raises(NotApplicable):
        N.nonfinite(ev(("nan_monitor", {"rows": 0})))
    with pytest.raises(NotApplicable):
        N.nonfinite(ev())


# ---------------------------------------------------------------------------- fp16
def amp(**kw):
    base = {"fp16_backwards": 0, "unscaled_fp16_backwards": 0, "scaled_backwards": 0,
            "bf16_backwards": 0, "first_unscaled_step": None, "devices": [], "fp16_params": False}
    return ("amp", {**base, **kw})


def test_fp16_without_scaler():
    (f,) = G.fp16_without_scaler(ev(amp(fp16_backwards=5, unscaled_fp16_backwards=5,
                                        first_unscaled_step=1, devices=["cuda"])))
    assert f.code == "fp16-without-scaler" and f.skill == "mixed-precision-and-optimization"
    assert "step 1" in f.title


def test_fp16_with_scaler_and_bf16_are_fine():
    assert G.fp16_without_scaler(ev(amp(fp16_backwards=5, scaled_backwards=5))) == []
    with pytest.raises(NotApplicable):
        G.fp16_without_scaler(ev(amp(bf16_backwards=5)))
    (f,) = G.fp16_without_scaler(ev(amp(fp16_params=True, first_unscaled_step=1)))
    assert "float16 parameters" in f.title


# ---------------------------------------------------------------------------- zero_grad
def test_missing_zero_grad_confirmed_by_nonzero_norms():
    e = ev(("zero_grad_stale", {"step": 2, "optimizer": 0, "stale": 2, "with_grad": 2,
                                "consumed_at": 1, "params": ["m.w", "m.b"],
                                "norms_ref": [[0, 0], [0, 1]]}),
           ("zero_grad_summary", {"judged_steps": 9, "stale_steps": 9, "suspect_norms": [[0.5, 0.1]]}),
           ("step", {"step": 2, "backwards": 1}))
    (f,) = T.missing_zero_grad(e)
    assert f.code == "missing-zero-grad" and "before step 2" in f.title
    assert f.evidence["backwards_in_step"] == 1 and f.evidence["steps_affected"] == 9


def test_zeroed_through_data_is_not_missing_zero_grad():
    e = ev(("zero_grad_stale", {"step": 2, "optimizer": 0, "stale": 2, "with_grad": 2,
                                "consumed_at": 1, "params": [], "norms_ref": [[0, 0], [0, 1]]}),
           ("zero_grad_summary", {"judged_steps": 9, "stale_steps": 9, "suspect_norms": [[0.0, 0.0]]}))
    assert T.missing_zero_grad(e) == []


def test_missing_zero_grad_needs_two_steps():
    with pytest.raises(NotApplicable):
        T.missing_zero_grad(ev(("zero_grad_summary", {"judged_steps": 0})))


# ---------------------------------------------------------------------------- modes, audit, shapes
def test_eval_mode_training():
    e = ev(("eval_mode", {"step": 6, "count": 2, "modules": ["m.1 (BatchNorm1d)", "m.3 (Dropout)"],
                          "roots_training_flag": {"m": False}}),
           ("eval_mode_summary", {"judged_steps": 20, "eval_steps": 15, "mode_modules": 2}))
    (f,) = T.eval_mode_training(e)
    assert "from step 6" in f.title and f.evidence["steps_in_eval_mode"].startswith("15 of 20")
    assert T.eval_mode_training(ev(("eval_mode_summary", {"judged_steps": 20, "eval_steps": 0,
                                                          "mode_modules": 3}))) == []
    with pytest.raises(NotApplicable):
        T.eval_mode_training(ev(("eval_mode_summary", {"judged_steps": 20, "mode_modules": 0})))


def audit(**kw):
    base = {"step": 10, "final": True, "optimizers": 1, "optimizer_steps": 10, "trained_roots": ["net"],
            "trainable": 6, "unused": [], "unused_count": 0, "not_in_optimizer": [],
            "not_in_optimizer_count": 0, "unregistered": []}
    return ("params_audit", {**base, **kw})


def test_params_audit_rules():
    e = ev(audit(unused=[{"name": "net.aux.weight", "numel": 36}], unused_count=1,
                 not_in_optimizer=[{"name": "net.head.bias", "numel": 1, "has_grad": True}],
                 not_in_optimizer_count=1,
                 unregistered=[{"attribute": "net.layers[0]", "container": "list",
                                "module_class": "Linear", "params": 272, "in_optimizer": False,
                                "received_grad": True}]))
    assert [f.code for f in T.unused_parameters(e)] == ["unused-parameters"]
    assert [f.code for f in T.params_not_in_optimizer(e)] == ["params-not-in-optimizer"]
    (u,) = T.unregistered_submodule(e)
    assert "net.layers" in u.title and "list" in u.title
    clean = ev(audit())
    assert T.unused_parameters(clean) == [] == T.params_not_in_optimizer(clean)
    assert T.unregistered_submodule(clean) == []


def test_unused_needs_two_steps_and_audit_needs_a_step():
    with pytest.raises(NotApplicable):
        T.unused_parameters(ev(audit(optimizer_steps=1, unused_count=1,
                                     unused=[{"name": "a", "numel": 1}])))
    with pytest.raises(NotApplicable):
        T.params_not_in_optimizer(ev())


def test_final_audit_wins_over_early_ones():
    e = ev(audit(final=False, not_in_optimizer=[{"name": "x", "numel": 1}], not_in_optimizer_count=1),
           audit(final=True))
    assert T.params_not_in_optimizer(e) == []


def test_loss_shape_broadcast():
    rec = {"fn": "F.mse_loss", "input_shape": [32, 1], "target_shape": [32], "result_shape": [32, 32],
           "where": "train.py:21 in <module>", "code": "loss = F.mse_loss(out, y)", "step": 1, "count": 15}
    (f,) = T.loss_shape_broadcast(ev(("loss_shape", rec), ("loss_watch", {"calls": 15})))
    assert "[32, 1]" in f.title and "[32, 32]" in f.title and f.evidence["code"].startswith("loss =")
    assert T.loss_shape_broadcast(ev(("loss_watch", {"calls": 3}))) == []
    with pytest.raises(NotApplicable):
        T.loss_shape_broadcast(ev(("loss_watch", {"calls": 0, "functions": ["F.mse_loss"]})))
