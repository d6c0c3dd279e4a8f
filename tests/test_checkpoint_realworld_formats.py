"""Checkpoints laid out like those of real public training code (issue 13): the healthy ones raise no
warning, Lightning's inf sentinels are not weights, nanoGPT's ``iter_num`` is progress, and a resume
snapshot without its optimizer is a warning. Every file is written here, in the style of the code it
imitates (nothing is copied from those projects; no binary is committed).
"""

import argparse
import json
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.report.console import render_to_text


class TinyGPT(nn.Module):
    """nanoGPT-like naming: transformer.wte/wpe/h.N/ln_f, lm_head tied to wte."""

    def __init__(self, vocab=32, block=8, n_embd=16, n_layer=2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block, n_embd),
            h=nn.ModuleList([nn.ModuleDict(dict(ln_1=nn.LayerNorm(n_embd), attn=nn.Linear(n_embd, 3 * n_embd),
                                                mlp=nn.Linear(n_embd, n_embd))) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for blk in self.transformer.h:
            x = x + blk.mlp(blk.ln_1(x))
        return self.lm_head(self.transformer.ln_f(x))


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TrainingArguments:
    """Stands for transformers.TrainingArguments in training_args.bin (a pickled config object)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _train(model, opt, steps=2, sched=None, x=None):
    for _ in range(steps):
        out = model(x if x is not None else torch.randn(4, 4))
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()


def nanogpt(d, with_optimizer=True, cpu_fp16=False):
    torch.manual_seed(0)
    model = TinyGPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95))
    _train(model, opt, x=torch.randint(0, 32, (2, 8)))
    for g in opt.param_groups:  # nanoGPT sets the lr by hand each iteration (no scheduler)
        g["lr"] = 5e-4
    sd = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}  # saved from the compiled model
    config = {"out_dir": "out", "eval_interval": 250, "batch_size": 12, "block_size": 8, "learning_rate": 6e-4,
              "max_iters": 5000, "decay_lr": True, "device": "cpu" if cpu_fp16 else "cuda",
              "dtype": "float16" if cpu_fp16 else "bfloat16", "compile": True, "init_from": "scratch"}
    ckpt = {"model": sd, "model_args": dict(n_layer=2, n_head=2, n_embd=16, block_size=8, bias=True,
                                            vocab_size=32, dropout=0.0),
            "iter_num": 250, "best_val_loss": torch.tensor(1.8123), "config": config}
    if with_optimizer:
        ckpt["optimizer"] = opt.state_dict()
    torch.save(ckpt, d / "ckpt.pt")
    return d / "ckpt.pt"


def lightning(d, nan_weight=False):
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    _train(net, opt, sched=sched)
    sd = {f"model.{k}": v for k, v in net.state_dict().items()}
    if nan_weight:
        sd["model.fc1.weight"] = sd["model.fc1.weight"].clone()
        sd["model.fc1.weight"][0, 0] = float("nan")
    progress = {"total": {"ready": 60, "started": 60, "processed": 60, "completed": 60},
                "current": {"ready": 20, "started": 20, "processed": 20, "completed": 20}}
    ckpt = {
        "epoch": 2, "global_step": 60, "pytorch-lightning_version": "2.4.0",
        "state_dict": sd,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": 60},
                               "epoch_loop.batch_progress": {**progress, "is_last_batch": True},
                               "epoch_progress": progress},
                  "validate_loop": {"state_dict": {}, "batch_progress": progress}},
        "callbacks": {
            "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
            "'train_time_interval': None}": {
                "monitor": None, "best_model_score": None, "best_model_path": "/runs/epoch=2-step=60.ckpt",
                "current_score": None, "dirpath": "/runs", "best_k_models": {}, "kth_best_model_path": "",
                "kth_value": torch.tensor(float("inf")), "last_model_path": ""},
            "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'max', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
            "'train_time_interval': None}": {
                "monitor": "val_loss", "best_model_score": torch.tensor(float("-inf")), "best_model_path": "",
                "current_score": torch.tensor(float("-inf")), "dirpath": "/runs", "best_k_models": {},
                "kth_best_model_path": "", "kth_value": torch.tensor(float("-inf")), "last_model_path": ""},
            "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}": {
                "wait_count": 0, "stopped_epoch": 0, "best_score": torch.tensor(float("inf")), "patience": 3},
        },
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [sched.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 1e-3, "hidden": 8},
    }
    torch.save(ckpt, d / "last.ckpt")
    return d / "last.ckpt"


def _write_safetensors(tensors, path):
    names = {torch.float32: "F32"}
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def hf_trainer(d, weights="model.safetensors", fp16=False):
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.AdamW(net.parameters(), lr=5e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 100)
    _train(net, opt, sched=sched)
    folder = d / "checkpoint-500"
    folder.mkdir()
    if weights.endswith(".safetensors"):
        _write_safetensors(net.state_dict(), folder / weights)
    else:
        torch.save(net.state_dict(), folder / weights)
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save(sched.state_dict(), folder / "scheduler.pt")
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 500, "epoch": 1.6, "max_steps": 1000,
                                                           "log_history": [{"loss": 2.3, "step": 500}]}))
    torch.save(TrainingArguments(output_dir="out", learning_rate=5e-5, fp16=fp16, bf16=not fp16),
               folder / "training_args.bin")
    return folder


def accelerate_state(d):
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt)
    _train(net, opt, sched=sched)
    folder = d / "checkpoint_0"
    folder.mkdir()
    _write_safetensors(net.state_dict(), folder / "model.safetensors")
    torch.save(opt.state_dict(), folder / "optimizer.bin")
    torch.save(sched.state_dict(), folder / "scheduler.bin")
    torch.save({"step": 0, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
                "torch_manual_seed": torch.get_rng_state(), "torch_cuda_manual_seed": []},
               folder / "random_states_0.pkl")
    return folder


def ddp_tutorial_snapshot(d):
    torch.manual_seed(0)
    net = Small()
    torch.save({"MODEL_STATE": net.state_dict(), "EPOCHS_RUN": 5}, d / "snapshot.pt")
    return d / "snapshot.pt"


def mingpt_ddp_snapshot(d):
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    _train(net, opt)
    torch.save({"model_state": net.state_dict(), "optimizer_state": opt.state_dict(), "finished_epoch": 3},
               d / "snapshot.pt")
    return d / "snapshot.pt"


def torchvision_reference(d, amp=False):
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    _train(net, opt, sched=sched)
    args = argparse.Namespace(data_path="/data/imagenet", model="resnet18", device="cuda", batch_size=32,
                              epochs=90, lr=0.1, momentum=0.9, weight_decay=1e-4, lr_scheduler="steplr",
                              output_dir="out", amp=amp, resume="", start_epoch=0)
    ckpt = {"model": net.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict(),
            "epoch": 4, "args": args}
    if amp:
        ckpt["scaler"] = torch.amp.GradScaler("cpu").state_dict()
    torch.save(ckpt, d / f"checkpoint{'_amp' if amp else ''}.pth")
    return d / f"checkpoint{'_amp' if amp else ''}.pth"


# name -> (builder, the exact findings {code: severity})
CASES = {
    "nanogpt": (nanogpt, {"ckpt-wrapper-prefix": "info", "ckpt-missing-rng": "info"}),
    "nanogpt_cpu_float16": (lambda d: nanogpt(d, cpu_fp16=True),
                            {"ckpt-wrapper-prefix": "info", "ckpt-missing-rng": "info"}),
    "lightning": (lightning, {"ckpt-missing-rng": "info"}),
    "hf_trainer": (hf_trainer, {"ckpt-unsafe-pickle": "info"}),
    "hf_trainer_bin": (lambda d: hf_trainer(d, "pytorch_model.bin"), {"ckpt-unsafe-pickle": "info"}),
    # the Trainer saves no scaler.pt under fp16 (its GradScaler lives in accelerate): info, not a warning
    "hf_trainer_fp16": (lambda d: hf_trainer(d, fp16=True),
                        {"ckpt-unsafe-pickle": "info", "ckpt-missing-scaler": "info"}),
    "accelerate": (accelerate_state, {"ckpt-unsafe-pickle": "info"}),
    "mingpt_ddp": (mingpt_ddp_snapshot, {"ckpt-missing-rng": "info"}),
    "torchvision": (torchvision_reference, {"ckpt-unsafe-pickle": "info", "ckpt-missing-rng": "info"}),
    "torchvision_amp": (lambda d: torchvision_reference(d, amp=True),
                        {"ckpt-unsafe-pickle": "info", "ckpt-missing-rng": "info"}),
}
# issue 13 item 4: a resume snapshot without its optimizer is a training snapshot: the missing optimizer warns
SNAPSHOTS = {
    "ddp_tutorial": (ddp_tutorial_snapshot, {"ckpt-missing-optimizer": "warning", "ckpt-missing-scheduler": "info",
                                             "ckpt-missing-rng": "info"}),
    "nanogpt_without_optimizer": (lambda d: nanogpt(d, with_optimizer=False),
                                  {"ckpt-missing-optimizer": "warning", "ckpt-missing-scheduler": "info",
                                   "ckpt-missing-rng": "info", "ckpt-wrapper-prefix": "info"}),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = {}
    for name, (fn, _exp) in {**CASES, **SNAPSHOTS}.items():
        d = tmp_path_factory.mktemp(name)
        out[name] = str(fn(d))
    return out


def _codes(rep):
    return {f.code: f.severity for f in rep.findings}


@pytest.mark.parametrize("name", sorted(CASES))
def test_healthy_real_world_checkpoint_raises_no_warning(built, name):
    rep = run(built[name], Options())
    assert _codes(rep) == CASES[name][1], [(f.code, f.severity, f.title) for f in rep.findings]
    assert rep.exit_code("warning") == 0
    render_to_text(rep)


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_resume_snapshot_without_optimizer_is_a_warning(built, name):
    rep = run(built[name], Options())
    assert _codes(rep) == SNAPSHOTS[name][1], [(f.code, f.severity, f.title) for f in rep.findings]
    f = next(f for f in rep.findings if f.code == "ckpt-missing-optimizer")
    assert "training snapshot" in f.title and "fine for inference" not in f.title
    assert rep.metrics["checkpoint"]["judged_as"] == "resume"


def test_nanogpt_iter_num_is_progress(built):
    rep = run(built["nanogpt"], Options())
    assert "ckpt-missing-progress" not in _codes(rep)
    assert rep.metrics["checkpoint"]["roles"]["progress"] == {"iter_num": 250}
    assert run(built["ddp_tutorial"], Options()).metrics["checkpoint"]["roles"]["progress"] == {"EPOCHS_RUN": 5}
    assert run(built["mingpt_ddp"], Options()).metrics["checkpoint"]["roles"]["progress"] == {"finished_epoch": 3}


def test_lightning_inf_sentinels_are_not_weights(built):
    rep = run(built["lightning"], Options())
    assert "ckpt-nonfinite-weights" not in _codes(rep)
    facts = rep.metrics["checkpoint"]["facts"]["nonfinite_bookkeeping"]
    assert any("kth_value" in x for x in facts) and any("best_score" in x for x in facts)


def test_nan_in_lightning_weights_is_still_an_error(tmp_path):
    rep = run(str(lightning(tmp_path, nan_weight=True)), Options())
    f = next(f for f in rep.findings if f.code == "ckpt-nonfinite-weights")
    assert f.severity == "error" and f.evidence["tensors"] == ["state_dict.model.fc1.weight float32[8, 4]: 1 NaN"]
    assert "(1 model, 0 optimizer state" in f.title


def test_nan_in_optimizer_state_is_an_error(tmp_path):
    net = Small()
    opt = torch.optim.Adam(net.parameters())
    _train(net, opt)
    sd = opt.state_dict()
    sd["state"][0]["exp_avg_sq"][0, 0] = float("inf")
    torch.save({"model": net.state_dict(), "optimizer": sd, "epoch": 1}, tmp_path / "c.pt")
    f = next(f for f in run(str(tmp_path / "c.pt"), Options()).findings if f.code == "ckpt-nonfinite-weights")
    assert "1 optimizer state" in f.title and f.severity == "error"


def test_numpy_rng_in_a_user_checkpoint_is_a_warning(tmp_path):
    """A plain torch.load (weights_only=True since 2.6) refuses it: resuming breaks."""
    net = Small()
    opt = torch.optim.Adam(net.parameters())
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 1,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}}, tmp_path / "c.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "c.pt")  # the claim, checked against the installed torch
    f = next(f for f in run(str(tmp_path / "c.pt"), Options()).findings if f.code == "ckpt-unsafe-pickle")
    assert f.severity == "warning" and "UnpicklingError" in f.title
    assert "dtypes.UInt32DType" in f.fix and "safe_globals" in f.fix
    import numpy

    with torch.serialization.safe_globals([numpy._core.multiarray._reconstruct, numpy.ndarray, numpy.dtype,
                                           numpy.dtypes.UInt32DType]):
        torch.load(tmp_path / "c.pt")  # the fix given works


def test_the_same_numpy_state_in_framework_rng_files_is_info(built):
    for name in ("hf_trainer", "accelerate"):
        f = next(f for f in run(built[name], Options()).findings if f.code == "ckpt-unsafe-pickle")
        assert f.severity == "info", (name, f.title)


def test_nanogpt_cpu_float16_config_is_no_scaler_sign(built):
    """nanoGPT's default dtype='float16' on device='cpu': no autocast, GradScaler disabled, float32 tensors."""
    rep = run(built["nanogpt_cpu_float16"], Options())
    assert set(rep.metrics["checkpoint"]["dtypes"]) == {"float32"}
    assert "ckpt-missing-scaler" not in _codes(rep)
    assert rep.exit_code("warning") == 0


def test_nanogpt_gpu_float16_without_scaler_state_is_info_with_its_real_cost(tmp_path):
    """On CUDA nanoGPT runs a GradScaler under dtype='float16' but never saves it: a resume re-calibrates the
    scale in a few skipped steps (measured: settled at 64 → 10 skipped). Honest: info, a warning only when an
    exact resume is asked for."""
    path = nanogpt(tmp_path)
    ckpt = torch.load(path, weights_only=True)
    ckpt["config"].update(device="cuda", dtype="float16")
    torch.save(ckpt, path)
    rep = run(str(path), Options())
    f = next(f for f in rep.findings if f.code == "ckpt-missing-scaler")
    assert f.severity == "info" and "overflow or underflow" not in f.title
    assert "skipping a few optimizer steps" in f.title and "65536" in f.title
    assert "16-k steps" in f.evidence["cost_on_resume"]
    assert rep.exit_code("warning") == 0
    strict = run(str(path), Options(expect="resume"))
    assert {x.code: x.severity for x in strict.findings}["ckpt-missing-scaler"] == "warning"


def test_ddp_tutorial_missing_optimizer_text_is_exact(built):
    """The DDP tutorial's {"MODEL_STATE", "EPOCHS_RUN"}: the warning says what is lost, and that it is harmless
    only for a stateless optimizer, which the audit cannot see."""
    f = next(f for f in run(built["ddp_tutorial"], Options()).findings if f.code == "ckpt-missing-optimizer")
    assert f.severity == "warning" and "EPOCHS_RUN" in f.title
    assert "momentum buffers, Adam moments, step counts" in f.title
    assert "harmless only for a stateless optimizer (plain SGD without momentum)" in f.fix
    assert "cannot see" in f.fix
