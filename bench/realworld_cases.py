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
    outputs: tuple[str, ...] = ()   # other files the harm check compares (globs relative to the run dir)
    compare: str = ""               # regex: the script's output lines the harm check compares
    needs: tuple[str, ...] = ()     # modules --python must import (else the case is skipped, saying which)


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


def prep_cora(case: Path, src: Path) -> None:
    """gcn/main.py fetches ``cora.tgz`` with ``requests.get(URL, stream=True)`` at every start and
    extracts it into its cwd, then reads ``./cora/cora.content`` (paper id, 1433 binary word features,
    class name; tab-separated) and ``./cora/cora.cites`` (cited id, citing id). Writes a tgz in that
    format (Cora's sizes: 2708 papers, 7 classes, 5429 citations; random values) and a ``requests``
    stand-in (``assets/shim``, put first on PYTHONPATH) whose ``get`` serves that one URL from disk and
    refuses any other."""
    import io
    import tarfile

    r = _rng(11)
    classes = ("Case_Based", "Genetic_Algorithms", "Neural_Networks", "Probabilistic_Methods",
               "Reinforcement_Learning", "Rule_Learning", "Theory")
    ids = r.sample(range(30, 1_200_000), 2708)
    rows = []
    for pid in ids:
        words = ["1" if r.random() < 0.0127 else "0" for _ in range(1433)]
        rows.append("\t".join([str(pid)] + words + [r.choice(classes)]))
    cites = set()
    while len(cites) < 5429:
        a, b = r.choice(ids), r.choice(ids)
        if a != b:
            cites.add((a, b))
    files = {"cora/cora.content": "\n".join(rows) + "\n",
             "cora/cora.cites": "".join(f"{a}\t{b}\n" for a, b in sorted(cites)),
             "cora/README": "A synthetic stand-in in Cora's format (random features, labels and citations).\n"}
    a = case / "assets"
    a.mkdir(parents=True, exist_ok=True)
    tgz = a / "cora.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    shim = a / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "requests.py").write_text(
        '"""A stand-in for requests.get in the real-world bench: serves gcn\'s Cora URL from a local file."""\n'
        "CORA_URL = 'https://linqs-data.soe.ucsc.edu/public/lbc/cora.tgz'\n"
        f"CORA_TGZ = {str(tgz)!r}\n\n\n"
        "class _Response:\n"
        "    def __init__(self, path):\n"
        "        self.raw = open(path, 'rb')\n\n"
        "    def __enter__(self):\n"
        "        return self\n\n"
        "    def __exit__(self, *exc):\n"
        "        self.raw.close()\n\n\n"
        "def get(url, stream=False, **kwargs):\n"
        "    if url != CORA_URL:\n"
        "        raise ConnectionError(f'the bench has no network: {url}')\n"
        "    return _Response(CORA_TGZ)\n", encoding="utf-8")


def _random_images(folder: Path, n: int, size: tuple[int, int], suffix: str, seed: int) -> None:
    """n random RGB images (noise over a random base colour, so classes are not all alike)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(seed)
    w, h = size
    for i in range(n):
        base = g.integers(0, 256, 3)
        px = np.clip(base + g.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(px, "RGB").save(folder / f"{i:05d}{suffix}")


def prep_bsds300(case: Path, src: Path) -> None:
    """super_resolution's data.py downloads BSDS300 unless ``dataset/BSDS300/images`` exists (cwd):
    32 train + 10 test random JPEGs of BSDS300's size (481 x 321)."""
    root = case / "assets" / "dataset" / "BSDS300" / "images"
    _random_images(root / "train", 32, (481, 321), ".jpg", 21)
    _random_images(root / "test", 10, (481, 321), ".jpg", 22)


def prep_imagefolder(case: Path, src: Path) -> None:
    """timm's train.py with ``--data-dir``: an ImageFolder tree (``train/``, ``validation/``), 4 classes,
    16 + 4 random 64 x 64 PNGs a class."""
    root = case / "assets" / "imagefolder"
    for k in range(4):
        _random_images(root / "train" / f"class{k}", 16, (64, 64), ".png", 100 + k)
        _random_images(root / "validation" / f"class{k}", 4, (64, 64), ".png", 200 + k)


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

# the LightningCLI classifier: the same bounds, but a relative log dir, so its checkpoints do not hold
# the run dir's path and two runs' files can be compared byte for byte
LIGHTNING_CLS_ARGS = tuple(a for a in LIGHTNING_ARGS if not a.startswith("--trainer.default_root_dir")) + (
    "--trainer.default_root_dir=logs",)
LIGHTNING_NEEDS = ("lightning", "jsonargparse", "torchvision")
LIGHTNING_CKPT = ("logs/lightning_logs/version_0/checkpoints/*.ckpt",)

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
    Case("gcn", "pytorch/examples", "examples", "examples/gcn/main.py",
         ("--epochs", "30", "--include-bias"),
         "2-layer GCN on a Cora-format stand-in (2708 nodes x 1433 features, 7 classes), 30 full-graph steps",
         prepare=prep_cora, needs=("numpy",), env={"PYTHONPATH": "{case}/assets/shim"}, compare=r"^Test set results",
         exercises="issue 27 item 2 (sparse COO adjacency, torch.spmm in forward), a download at start-up "
                   "(served from disk by a requests stand-in), eval after every step"),
    Case("super_resolution", "pytorch/examples", "examples", "examples/super_resolution/main.py",
         ("--upscale_factor", "3", "--batchSize", "8", "--testBatchSize", "5", "--nEpochs", "2",
          "--threads", "2"),
         "ESPCN super-resolution on 32 + 10 random BSDS300-sized JPEGs, 2 epochs = 8 steps, 2 loader workers",
         checkpoints=("model_epoch_2.pth",), outputs=("model_epoch_1.pth",), prepare=prep_bsds300,
         needs=("torchvision", "PIL", "six"),
         links=(("dataset", "assets/dataset"),), compare=r"Avg\. PSNR",
         exercises="torch.save(model) every epoch (whole-module pickle), PIL YCbCr decoding in 2 workers"),
    Case("timm_train", "huggingface/pytorch-image-models", "pytorch-image-models", "pytorch-image-models/train.py",
         ("--data-dir", "{case}/assets/imagefolder", "--model", "resnet10t", "--num-classes", "4",
          "--img-size", "64", "-b", "16", "--epochs", "2", "-j", "1", "--output", "out", "--experiment", "run",
          "--log-interval", "1", "--device", "cpu", "--checkpoint-hist", "2"),
         "timm's train.py: resnet10t on a 4-class ImageFolder of random 64x64 PNGs, 2 epochs = 8 steps, "
         "cosine schedule, checkpoint every epoch, 1 loader worker (its create_loader asks for persistent "
         "workers, which torch's DataLoader refuses with -j 0)",
         checkpoints=("out/run/last.pth.tar",),
         outputs=("out/run/checkpoint-*.pth.tar", "out/run/model_best.pth.tar", "out/run/summary.csv"),
         prepare=prep_imagefolder, needs=("torchvision", "PIL", "yaml", "huggingface_hub", "safetensors"),
         exercises="issue 27 items 3 (profile's trace export) and 5 (timm's CosineLRScheduler.step(epoch), "
                   "the epoch saved, no scheduler state), CheckpointSaver's tmp-file rename"),
    Case("lightning_cls", "Lightning-AI/pytorch-lightning", "pytorch-lightning",
         "pytorch-lightning/examples/pytorch/basics/backbone_image_classifier.py", LIGHTNING_CLS_ARGS,
         "LightningCLI MNIST backbone classifier on synthetic MNIST: fit 50 batches, test/predict from 'best'",
         checkpoints=LIGHTNING_CKPT, prepare=prep_lightning, needs=LIGHTNING_NEEDS, links=(("data", "data"),),
         compare=r"^tensor\(|^\s+\[", exercises="LightningCLI with a backbone, Trainer loops, buffer-written .ckpt"),
    Case("lightning_cls_ddp", "Lightning-AI/pytorch-lightning", "pytorch-lightning",
         "pytorch-lightning/examples/pytorch/basics/backbone_image_classifier.py",
         LIGHTNING_CLS_ARGS + ("--trainer.strategy=ddp", "--trainer.devices=2"),
         "the same classifier, strategy=ddp on 2 CPU ranks (gloo) launched by torchrun",
         probes=DDP_PROBES, nproc=2, checkpoints=LIGHTNING_CKPT, prepare=prep_lightning, needs=LIGHTNING_NEEDS,
         links=(("data", "data"),), exercises="issue 27 item 7 (rank-straggler on a healthy gloo job)"),
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
