"""The real public training scripts of the real-world bench (``bench/realworld.py``).

Each ``Case`` names a script inside a *fetched* public repository (never copied into this repo),
the argv that bounds it to a short run on a 2-core CPU, the synthetic data it needs (written by
``prepare`` in the on-disk format the script itself reads: no network), the probes that apply and
the checkpoint files it writes. Layout, under ``--work DIR`` (default ``OUT/work``)::

    WORK/<case>/assets/...    prepared once (``prepare(case_dir, src)``), marker ``.prepared``
    WORK/<case>/data/...      same (pytorch/examples read ``../data`` from the working dir)
    WORK/<case>/<run-id>/     a fresh working dir per run (cwd of the script); ``links`` are
                              symlinked into it; the script's outputs and checkpoints land here

Argument placeholders: ``{run}`` the run dir, ``{case}`` the case dir, ``{src}`` the src root.
The ``src`` root holds one folder per fetched repository (``nanoGPT``, ``examples``, ...).

Data fabrication writes only synthetic values (random tokens, random images, generated text);
nothing here is third-party code.
"""

from __future__ import annotations

import csv
import os
import pickle
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

# the probes that run the script many times (treat, repro, compile's eager run) or check
# after it (gradcheck) come after the one-run probes; pick them with --probes
SINGLE_PROBES = ("checkup", "profile", "memory", "nan", "treat", "repro", "compile", "gradcheck")
DDP_PROBES = ("checkup", "profile", "memory", "nan", "dist")


@dataclass(frozen=True)
class Case:
    name: str
    repo: str                       # owner/name of the fetched repository
    folder: str                     # its folder under --src
    script: str                     # path of the script relative to --src
    args: tuple[str, ...]           # the script's argv (placeholders {run} {case} {src})
    what: str                       # one line: what it trains, how it is bounded
    probes: tuple[str, ...] = SINGLE_PROBES
    nproc: Optional[int] = None     # DDP: N local ranks through torchrun (gloo on CPU)
    checkpoints: tuple[str, ...] = ()   # globs relative to the run dir
    prepare: Optional[Callable[[Path, Path], None]] = None
    links: tuple[tuple[str, str], ...] = ()  # (name in run dir, path relative to case dir or {src}/...)
    env: dict = field(default_factory=dict)
    dirs: tuple[str, ...] = ()      # empty folders the script expects in its working dir
    needs_gpu: int = 0              # GPUs needed (0: runs on the CPU box)
    exercises: str = ""             # issue-13 items / behaviours it exercises


# ---------------------------------------------------------------------------------- data makers

def _rng(seed: int = 1234) -> random.Random:
    return random.Random(seed)


def _write_idx(path: Path, magic: int, dims: tuple[int, ...], payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(payload)


def make_mnist(root: Path, n_train: int, n_test: int) -> None:
    """torchvision's MNIST raw layout (``root/MNIST/raw/*-ubyte``, IDX format) with random pixels."""
    raw = root / "MNIST" / "raw"
    r = _rng(7)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        pix = bytes(r.getrandbits(8) for _ in range(n * 28 * 28)) if n <= 2000 else os.urandom(n * 784)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", 0x00000803, (n, 28, 28), pix)
        labels = bytes(r.randrange(10) for _ in range(n))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", 0x00000801, (n,), labels)


def prep_nanogpt(case: Path, src: Path) -> None:
    """nanoGPT's data/shakespeare_char: train.bin/val.bin (uint16 tokens) and meta.pkl."""
    import numpy as np

    d = case / "assets" / "data" / "shakespeare_char"
    d.mkdir(parents=True, exist_ok=True)
    chars = [chr(c) for c in range(32, 32 + 65)]
    g = np.random.default_rng(0)
    g.integers(0, len(chars), 200_000, dtype=np.uint16).tofile(d / "train.bin")
    g.integers(0, len(chars), 20_000, dtype=np.uint16).tofile(d / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
            "stoi": {c: i for i, c in enumerate(chars)}}
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def prep_wlm(case: Path, src: Path) -> None:
    """word_language_model's corpus folder (train/valid/test.txt): slices of the repo's own valid.txt
    (its train.txt is a large file the snapshot does not carry)."""
    lines = (src / "examples/word_language_model/data/wikitext-2/valid.txt").read_text(
        encoding="utf-8").splitlines()
    d = case / "assets" / "wikitext-2"
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.txt").write_text("\n".join(lines[:500]) + "\n", encoding="utf-8")
    (d / "valid.txt").write_text("\n".join(lines[500:600]) + "\n", encoding="utf-8")
    (d / "test.txt").write_text("\n".join(lines[600:700]) + "\n", encoding="utf-8")


def prep_mnist_small(case: Path, src: Path) -> None:
    make_mnist(case / "data", n_train=1024, n_test=256)


def prep_lightning(case: Path, src: Path) -> None:
    """autoencoder.py splits 60000 train images (55000/5000) and reads DATASETS_PATH
    (examples/Datasets in the checkout) and, through lightning's demo MNIST(), ./data too."""
    make_mnist(case / "data", n_train=60000, n_test=10000)
    link = src / "pytorch-lightning" / "examples" / "Datasets"
    if not link.exists():
        link.symlink_to(case / "data")


def prep_fabric(case: Path, src: Path) -> None:
    """train_fabric.py reads torchvision MNIST from DATASETS_PATH = the checkout's top-level Datasets/."""
    make_mnist(case / "data", n_train=1024, n_test=256)
    link = src / "pytorch-lightning" / "Datasets"
    if not link.exists():
        link.symlink_to(case / "data")


_WORDS = ("the market rose sharply after the company said profits would grow while analysts "
          "expected a weaker quarter and the shares fell in early trading on the news of a "
          "merger between two large banks that regulators had approved last week").split()


def _sentence(r: random.Random) -> str:
    return " ".join(r.choice(_WORDS) for _ in range(r.randint(8, 20))).capitalize() + " ."


def prep_accelerate(case: Path, src: Path) -> None:
    """What nlp_example.py loads by name, made locally (the names resolve to local folders first):
    ``bert-base-cased`` (a 2-layer BERT from a config, random weights + a word-level vocab),
    ``nyu-mll/glue`` (mrpc config: csv train/validation) and ``glue/glue.py`` (an evaluate metric
    script computing accuracy and F1)."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    a = case / "assets"
    bert = a / "bert-base-cased"
    bert.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + sorted(set(_WORDS)) + \
        sorted({w.capitalize() for w in _WORDS})
    (bert / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = BertTokenizerFast(vocab_file=str(bert / "vocab.txt"), do_lower_case=False)
    tok.save_pretrained(str(bert))
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=128)
    BertForSequenceClassification(cfg).save_pretrained(str(bert))

    glue = a / "nyu-mll" / "glue"
    (glue / "mrpc").mkdir(parents=True, exist_ok=True)
    (glue / "README.md").write_text(
        "---\nconfigs:\n- config_name: mrpc\n  data_files:\n  - split: train\n    path: mrpc/train.csv\n"
        "  - split: validation\n    path: mrpc/validation.csv\n---\nSynthetic MRPC-shaped data.\n",
        encoding="utf-8")
    r = _rng(3)
    for split, n in (("train", 256), ("validation", 64)):
        with open(glue / "mrpc" / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["sentence1", "sentence2", "label", "idx"])
            for i in range(n):
                w.writerow([_sentence(r), _sentence(r), r.randrange(2), i])

    metric = a / "glue"
    metric.mkdir(parents=True, exist_ok=True)
    (metric / "glue.py").write_text(
        '"""A local stand-in for the hub\'s glue metric (mrpc: accuracy and F1)."""\n'
        "import datasets\nimport evaluate\n\n\n"
        "class Glue(evaluate.Metric):\n"
        "    def _info(self):\n"
        "        return evaluate.MetricInfo(description='glue', citation='', inputs_description='',\n"
        "            features=datasets.Features({'predictions': datasets.Value('int64'),\n"
        "                                        'references': datasets.Value('int64')}))\n\n"
        "    def _compute(self, predictions, references):\n"
        "        pairs = list(zip(predictions, references))\n"
        "        acc = sum(p == r for p, r in pairs) / max(len(pairs), 1)\n"
        "        tp = sum(p == 1 and r == 1 for p, r in pairs)\n"
        "        fp = sum(p == 1 and r == 0 for p, r in pairs)\n"
        "        fn = sum(p == 0 and r == 1 for p, r in pairs)\n"
        "        f1 = 2 * tp / max(2 * tp + fp + fn, 1)\n"
        "        return {'accuracy': acc, 'f1': f1}\n", encoding="utf-8")


HF_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
          "HF_HOME": "{run}/hf-home", "TOKENIZERS_PARALLELISM": "false"}
ACC_LINKS = (("bert-base-cased", "assets/bert-base-cased"), ("nyu-mll", "assets/nyu-mll"),
             ("glue", "assets/glue"))
LIGHTNING_ARGS = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=50",
                  "--trainer.limit_val_batches=10", "--trainer.limit_test_batches=10",
                  "--trainer.limit_predict_batches=5", "--trainer.accelerator=cpu",
                  "--trainer.default_root_dir={run}/logs", "--trainer.enable_progress_bar=false")

CASES: list[Case] = [
    Case("nanogpt", "karpathy/nanoGPT", "nanoGPT", "nanoGPT/train.py",
         ("config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--out_dir={run}/out",
          "--eval_interval=30", "--eval_iters=5", "--log_interval=10", "--block_size=64", "--batch_size=12",
          "--n_layer=2", "--n_head=2", "--n_embd=64", "--max_iters=60", "--lr_decay_iters=60",
          "--warmup_iters=10", "--dropout=0.0"),
         "char GPT (2 layers, 64 wide) on synthetic shakespeare_char tokens, 61 iterations, eval at 0/30/60",
         checkpoints=("out/ckpt.pt",), prepare=prep_nanogpt,
         links=(("data", "assets/data"), ("configurator.py", "{src}/nanoGPT/configurator.py"),
                ("config", "{src}/nanoGPT/config")),
         exercises="item 4 (ckpt.pt stores iter_num), config-file argv, np.memmap batches"),
    Case("makemore", "karpathy/makemore", "makemore", "makemore/makemore.py",
         ("-i", "{src}/makemore/names.txt", "-o", "{run}/out", "--max-steps", "501", "--n-layer", "2",
          "--n-embd", "32", "--n-embd2", "32", "--num-workers", "2"),
         "char transformer on the repo's names.txt, 501 steps (eval + save at step 500), an InfiniteDataLoader with 2 workers",
         checkpoints=("out/model.pt",),
         exercises="forked DataLoader workers (RandomSampler with replacement), eval + sampling mid-run"),
    Case("mingpt_adder", "karpathy/minGPT", "minGPT", "minGPT/projects/adder/adder.py",
         ("--trainer.max_iters=501", "--system.work_dir='{run}/out'", "--data.ndigit=1", "--trainer.batch_size=32",
          "--trainer.num_workers=2"),
         "gpt-nano learns 1-digit addition (generated data), 501 iterations of 32, greedy eval at 0 and 500",
         checkpoints=("out/model.pt",),
         exercises="callback trainer, grad clipping, generate() under no_grad mid-run"),
    Case("wlm_lstm", "pytorch/examples", "examples", "examples/word_language_model/main.py",
         ("--data", "{case}/assets/wikitext-2", "--epochs", "1", "--emsize", "32", "--nhid", "32",
          "--save", "{run}/model.pt", "--log-interval", "20"),
         "2-layer LSTM LM on 500 lines of wikitext-2 valid.txt, 1 epoch, manual SGD (no optimizer)",
         checkpoints=("model.pt",), prepare=prep_wlm,
         exercises="item 1 (torch.save(model) whole-module pickling and torch.load of it), no optimizer"),
    Case("dcgan", "pytorch/examples", "examples", "examples/dcgan/main.py",
         ("--dataset", "fake", "--niter", "1", "--batchSize", "64", "--imageSize", "64", "--ngf", "8",
          "--ndf", "8", "--outf", "{run}/out", "--workers", "2"),
         "DCGAN (ngf=ndf=8) on torchvision FakeData (the script's own --dataset fake), 1 epoch = 16 iterations",
         checkpoints=("out/netG_epoch_0.pth", "out/netD_epoch_0.pth"),
         exercises="item 10 (two optimizers per iteration), weights_init, 2 workers"),
    Case("mnist", "pytorch/examples", "examples", "examples/mnist/main.py",
         ("--epochs", "2", "--save-model", "--log-interval", "4"),
         "the classic MNIST CNN, synthetic MNIST files (1024 train / 256 test), 2 epochs, Normalize",
         checkpoints=("mnist_cnn.pt",), prepare=prep_mnist_small,
         exercises="item 6 (Normalize transform, train + test loaders), StepLR"),
    Case("vae", "pytorch/examples", "examples", "examples/vae/main.py",
         ("--epochs", "2", "--log-interval", "4"),
         "the MNIST VAE, synthetic MNIST files, 2 epochs, writes sample images",
         prepare=prep_mnist_small, dirs=("results",), exercises="test loop every epoch, save_image"),
    Case("lightning_ae", "Lightning-AI/pytorch-lightning", "pytorch-lightning",
         "pytorch-lightning/examples/pytorch/basics/autoencoder.py", LIGHTNING_ARGS,
         "LightningCLI autoencoder on synthetic MNIST: fit 50 batches, val/test/predict from 'best' ckpt",
         checkpoints=("logs/lightning_logs/version_0/checkpoints/*.ckpt",), prepare=prep_lightning,
         links=(("data", "data"),),
         exercises="item 3 (ModelCheckpoint inf sentinel), Trainer loops, callbacks, ckpt_path='best'"),
    Case("lightning_ae_ddp", "Lightning-AI/pytorch-lightning", "pytorch-lightning",
         "pytorch-lightning/examples/pytorch/basics/autoencoder.py",
         LIGHTNING_ARGS + ("--trainer.strategy=ddp", "--trainer.devices=2"),
         "the same autoencoder, strategy=ddp on 2 CPU ranks (gloo) launched by torchrun",
         probes=DDP_PROBES, nproc=2,
         checkpoints=("logs/lightning_logs/version_0/checkpoints/*.ckpt",), prepare=prep_lightning,
         links=(("data", "data"),), exercises="Lightning DDP under torchrun, DistributedSampler set by Lightning"),
    Case("lightning_fabric", "Lightning-AI/pytorch-lightning", "pytorch-lightning",
         "pytorch-lightning/examples/fabric/image_classifier/train_fabric.py", ("--epochs", "1", "--save-model"),
         "Lightning Fabric's MNIST CNN (the mnist example ported to Fabric), synthetic MNIST, 1 epoch = 16 steps",
         checkpoints=("mnist_cnn.pt",), prepare=prep_fabric,
         exercises="Fabric setup/backward/save, torchmetrics Accuracy, StepLR, Normalize"),
    Case("accelerate_nlp", "huggingface/accelerate", "accelerate", "accelerate/examples/nlp_example.py",
         ("--cpu",),
         "accelerate's BERT/MRPC example: 2-layer BERT from a config, 256 synthetic pairs, 3 epochs (48 steps)",
         prepare=prep_accelerate, links=ACC_LINKS, env=HF_ENV,
         exercises="item 19 (the 1.87x case), transformers + datasets + evaluate, LR scheduler"),
    Case("accelerate_ckpt_ddp", "huggingface/accelerate", "accelerate",
         "accelerate/examples/complete_nlp_example.py",
         ("--cpu", "--checkpointing_steps", "epoch", "--output_dir", "{run}/out"),
         "accelerate's complete BERT/MRPC example on 2 CPU ranks (MULTI_CPU, gloo) launched by torchrun, "
         "save_state every epoch",
         probes=DDP_PROBES, nproc=2, prepare=prep_accelerate, links=ACC_LINKS, env=HF_ENV,
         checkpoints=("out/epoch_2",),  # the save_state folder is one checkpoint (audited as a directory)
         exercises="accelerate DDP wrapper, gather_for_metrics, save_state (safetensors, optimizer.bin, "
                   "scheduler.bin, random_states_0.pkl: item 12's NumPy RNG state)"),
    Case("ddp_tutorial", "pytorch/examples", "examples",
         "examples/distributed/ddp-tutorial-series/multigpu_torchrun.py",
         ("5", "2", "--batch_size", "32"),
         "the official DDP tutorial (Linear 20->1, 2048 samples), 5 epochs, snapshot every 2",
         probes=DDP_PROBES, nproc=2, checkpoints=("snapshot.pt",), needs_gpu=2,
         exercises="item 5 (next(iter(loader)) before set_epoch), item 4 (EPOCHS_RUN snapshot); "
                   "hard-codes torch.cuda.set_device + NCCL: GPU only"),
]


def by_name(names: Optional[str]) -> list[Case]:
    if not names:
        return list(CASES)
    want = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.name: c for c in CASES}
    missing = [n for n in want if n not in known]
    if missing:
        raise SystemExit(f"unknown case(s): {', '.join(missing)}; known: {', '.join(known)}")
    return [known[n] for n in want]


def _main(argv: list[str]) -> int:
    """``python realworld_cases.py prepare NAME CASE_DIR SRC`` (run by the bench's --python, which has
    numpy/transformers; the driver itself may run under any Python)."""
    if len(argv) != 4 or argv[0] != "prepare":
        print("usage: realworld_cases.py prepare NAME CASE_DIR SRC")
        return 2
    (case,) = by_name(argv[1])
    if case.prepare is not None:
        case.prepare(Path(argv[2]), Path(argv[3]))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
