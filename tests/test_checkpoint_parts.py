"""One file of a multi-file checkpoint is a *part*, not a checkpoint that lacks a model (issue 13).

accelerate's ``optimizer.bin`` or ``random_states_0.pkl`` audited alone used to get
``ckpt-missing-model`` (error) and missing-optimizer/-scheduler/-progress warnings. Every file here
is written at test time in the layout the framework writes (nothing copied from those projects).
"""

import os
import random

import numpy as np
import pytest
import torch

from test_checkpoint_realworld_formats import Small, _train, _write_safetensors, accelerate_state, hf_trainer
from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.report.console import render_to_text


def _codes(rep):
    return {f.code: f.severity for f in rep.findings}


def _part(rep):
    return next(f for f in rep.findings if f.code == "ckpt-part-file")


@pytest.fixture(scope="module")
def accel(tmp_path_factory):
    return accelerate_state(tmp_path_factory.mktemp("accel"))


@pytest.mark.parametrize("name, part, extra", [
    ("optimizer.bin", "optimizer state", {}),
    ("scheduler.bin", "LR-scheduler state", {}),
    ("random_states_0.pkl", "RNG state", {"ckpt-unsafe-pickle": "info"}),  # numpy's globals, as for the folder
    ("model.safetensors", "model weights", {}),
])
def test_each_file_of_an_accelerate_folder_is_a_part(accel, name, part, extra):
    rep = run(str(accel / name), Options())
    assert _codes(rep) == {"ckpt-part-file": "info", **extra}, [(f.code, f.severity, f.title) for f in rep.findings]
    f = _part(rep)
    assert f.evidence["part"] == part and f"the {part} of an accelerate save_state checkpoint" in f.title
    assert str(accel) in f.title and "audit the folder" in f.title
    assert rep.metrics["checkpoint"]["judged_as"] == "part"
    assert rep.exit_code("warning") == 0
    assert "judged as one part of a checkpoint" in " ".join(render_to_text(rep).split())


def test_the_accelerate_folder_itself_is_still_one_checkpoint(accel):
    rep = run(str(accel), Options())
    assert _codes(rep) == {"ckpt-unsafe-pickle": "info"}
    assert rep.metrics["checkpoint"]["judged_as"] == "resume"


def test_a_trainer_optimizer_file_names_the_trainer_folder(tmp_path):
    folder = hf_trainer(tmp_path)
    for name, part in (("optimizer.pt", "optimizer state"), ("scheduler.pt", "LR-scheduler state"),
                       ("rng_state.pth", "RNG state")):
        rep = run(str(folder / name), Options())
        assert rep.exit_code("warning") == 0, [(f.code, f.severity, f.title) for f in rep.findings]
        f = _part(rep)
        assert f.evidence["part"] == part and "Hugging Face Trainer" in f.title
        assert "ckpt-missing-model" not in _codes(rep)


def test_a_trainer_save_model_export_is_not_a_part(tmp_path):
    """trainer.save_model() writes the final weights beside training_args.bin: a whole weights export."""
    folder = hf_trainer(tmp_path)
    out = tmp_path / "final"
    out.mkdir()
    for n in ("model.safetensors", "training_args.bin"):
        (out / n).write_bytes((folder / n).read_bytes())
    rep = run(str(out / "model.safetensors"), Options())
    assert _codes(rep) == {"ckpt-missing-optimizer": "info"} and rep.metrics["checkpoint"]["judged_as"] == "weights"
    rep = run(str(folder / "training_args.bin"), Options())  # inside checkpoint-500/: a part
    assert "ckpt-missing-model" not in _codes(rep) and rep.exit_code("warning") == 0, _codes(rep)


def test_a_pickled_training_config_alone_is_a_part(tmp_path):
    import argparse

    torch.save(argparse.Namespace(lr=1e-3, epochs=3), tmp_path / "args.pt")
    rep = run(str(tmp_path / "args.pt"), Options())
    assert _part(rep).evidence["part"] == "training config" and "ckpt-missing-model" not in _codes(rep)
    assert rep.exit_code("warning") == 0


def _trained():
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    _train(net, opt, sched=sched)
    return net, opt, sched


@pytest.mark.parametrize("what", ["optimizer", "scheduler", "scaler", "rng"])
def test_a_lone_part_file_is_recognised_by_its_content(tmp_path, what):
    """No framework folder: torch.save(optimizer.state_dict(), 'optim.pt') beside nothing else."""
    net, opt, sched = _trained()
    obj = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
           "scaler": torch.amp.GradScaler("cpu").state_dict(),
           "rng": {"python": random.getstate(), "cpu": torch.get_rng_state(), "epoch": 3}}[what]
    torch.save(obj, tmp_path / f"{what}.pt")
    rep = run(str(tmp_path / f"{what}.pt"), Options())
    codes = _codes(rep)
    assert "ckpt-missing-model" not in codes and rep.exit_code("warning") == 0, codes
    f = _part(rep)
    assert f.severity == "info" and "holds only the" in f.title and f.evidence.get("layout") is None


def test_a_snapshot_without_model_is_still_missing_its_model(tmp_path):
    """Counters + optimizer, no weights, alone in its folder: a broken checkpoint, not a part."""
    _net, opt, _sched = _trained()
    torch.save({"optimizer": opt.state_dict(), "epoch": 3}, tmp_path / "ckpt.pt")
    rep = run(str(tmp_path / "ckpt.pt"), Options())
    assert _codes(rep).get("ckpt-missing-model") == "error"
    assert "ckpt-part-file" not in _codes(rep)


def test_a_whole_checkpoint_beside_unrelated_files_is_not_a_part(tmp_path):
    net, opt, sched = _trained()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "epoch": 2}, tmp_path / "ckpt.pt")
    (tmp_path / "log.txt").write_text("loss 1.0\n")
    torch.save(net.state_dict(), tmp_path / "best.pt")
    rep = run(str(tmp_path / "ckpt.pt"), Options())
    assert "ckpt-part-file" not in _codes(rep) and rep.metrics["checkpoint"]["judged_as"] == "resume"


def test_deepspeed_model_states_file_is_a_part(tmp_path):
    """DeepSpeed (ZeRO) writes the module and counters in one file, the optimizer in per-rank files."""
    net, opt, sched = _trained()
    ckpt = tmp_path / "global_step10"
    ckpt.mkdir()
    torch.save({"module": net.state_dict(), "optimizer": None, "lr_scheduler": sched.state_dict(),
                "global_steps": 10, "skipped_steps": 0, "dp_world_size": 1, "ds_version": "0.0"},
               ckpt / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"base_optimizer_state": opt.state_dict(), "partition_count": 1},
                "ds_version": "0.0"}, ckpt / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    rep = run(str(ckpt / "mp_rank_00_model_states.pt"), Options())
    assert _codes(rep) == {"ckpt-part-file": "info"}, [(f.code, f.severity, f.title) for f in rep.findings]
    assert "DeepSpeed" in _part(rep).title and _part(rep).evidence["part"] == "model weights"
    assert "audit the folder" not in _part(rep).title  # checkpoint-audit does not read it as one checkpoint
    assert "the other parts are the files beside it" in _part(rep).title
    rep = run(str(ckpt / "zero_pp_rank_0_mp_rank_00_optim_states.pt"), Options())
    assert rep.exit_code("warning") == 0 and "ckpt-missing-model" not in _codes(rep)
    assert _part(rep).evidence["part"] == "optimizer state"


def test_the_meta_file_of_a_dcp_folder_is_a_part(tmp_path):
    """Lightning's sharded FSDP checkpoint: a DCP folder plus meta.pt with the counters."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    net, _opt, _sched = _trained()
    folder = tmp_path / "epoch=0-step=10.ckpt"
    try:
        dcp.save({"model": net.state_dict()}, checkpoint_id=str(folder))
    except Exception as e:  # noqa: BLE001 - a torch without single-process DCP save
        pytest.skip(f"dcp.save unavailable: {e}")
    torch.save({"epoch": 0, "global_step": 10, "loops": {}, "callbacks": {}}, folder / "meta.pt")
    rep = run(str(folder / "meta.pt"), Options())
    assert "ckpt-missing-model" not in _codes(rep) and rep.exit_code("warning") == 0, _codes(rep)
    assert "distributed.checkpoint" in _part(rep).title
    assert _part(rep).evidence["part"] == "progress and bookkeeping state"
    assert run(str(folder), Options()).metrics["checkpoint"]["format"] == "dcp"
    shard = next(p for p in folder.iterdir() if p.name.endswith(".distcp"))
    rep = run(str(shard), Options())
    assert rep.exit_code("warning") == 0, _codes(rep)
    assert _part(rep).evidence["part"] == "tensor data shard"


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_code_running_part_is_still_an_error(accel, tmp_path):
    _net, opt, _sched = _trained()
    sd = opt.state_dict()
    sd["param_groups"][0]["hook"] = Payload()
    folder = tmp_path / "epoch_0"
    folder.mkdir()
    for n in os.listdir(accel):
        (folder / n).write_bytes((accel / n).read_bytes())
    torch.save(sd, folder / "optimizer.bin")
    rep = run(str(folder / "optimizer.bin"), Options())
    assert _codes(rep)["ckpt-unsafe-pickle"] == "error" and "ckpt-part-file" in _codes(rep)


@pytest.mark.parametrize("siblings, layout, whole", [
    (["model.safetensors", "optimizer.bin", "random_states_0.pkl"], "accelerate", True),
    (["pytorch_model_fsdp_0.bin", "optimizer_0.bin", "random_states_0.pkl"], "fsdp", True),
    (["model.safetensors", "trainer_state.json", "rng_state.pth"], "hf-trainer", True),
    (["mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"], "deepspeed", False),
    ([".metadata", "__1_0.distcp"], "dcp", True),
    (["epoch_1.pt", "best.pt", "log.txt"], None, False),
    (["model.safetensors", "training_args.bin", "config.json"], None, False),  # trainer.save_model() output
])
def test_sibling_layouts_by_name(tmp_path, siblings, layout, whole):
    from torchdoctor.checkpoint.layout import sibling_layout

    for n in siblings:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "audited.pt").write_bytes(b"")
    got = sibling_layout(str(tmp_path / "audited.pt"))
    assert (got and got["name"]) == (layout or None)
    if got:
        assert got["folder_audit"] is whole and got["folder"] == str(tmp_path)


def test_a_hostile_folder_name_reaches_the_console_escaped(tmp_path):
    folder = tmp_path / "ep\x1b[2J0"
    folder.mkdir()
    _net, opt, _sched = _trained()
    torch.save(opt.state_dict(), folder / "optimizer.bin")
    (folder / "random_states_0.pkl").write_bytes(b"")
    rep = run(str(folder / "optimizer.bin"), Options())
    assert str(folder) in _part(rep).title  # exact in the JSON
    text = render_to_text(rep)
    assert "\x1b" not in text and "\\x1b[2J" in text
