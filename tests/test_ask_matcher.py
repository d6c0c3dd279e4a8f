"""Routing of questions: the labelled sets, the seed's baselines, order, ambiguity, typos, gates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchdoctor.skills import ALL_SKILLS
from torchdoctor.triage import matcher
from torchdoctor.errortext.table import KNOWN
from torchdoctor.triage.gate import required_literals
from torchdoctor.triage.order import PRECEDENCE
from torchdoctor.triage.playbooks import BY_HAND, PLAYBOOKS
from torchdoctor.triage.symptoms import SIGNALS
from torchdoctor.triage.text import TYPO_TARGETS, correct_typos, normalize

FIX = Path(__file__).parent / "fixtures" / "ask"
ALIAS = {"mem": "tensor-operations-and-memory", "module": "module-design-patterns",
         "dist": "distributed-training-strategies", "mp": "mixed-precision-and-optimization",
         "perf": "performance-profiling", "debug": "debugging-techniques",
         "ckpt": "checkpointing-and-reproducibility", "autograd": "custom-autograd-functions"}
SETS = ("queries.tsv", "queries_holdout.tsv", "queries_holdout2.tsv")


def load(name: str) -> list[tuple[str, str]]:
    rows = []
    for line in (FIX / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            exp, q = line.split("\t", 1)
            rows.append((exp, q))
    return rows


def routes(q: str) -> list[str]:
    return [r.skill for r in matcher.triage(q).routes]


def correct(exp: str, q: str) -> bool:
    a = matcher.triage(q)
    if exp == "?":
        return a.clarify is not None and a.routes == []
    want = [ALIAS[x] for x in exp.split(",")]
    return [r.skill for r in a.routes][: len(want)] == want


def test_labelled_set_is_large_and_varied():
    rows = [r for name in SETS for r in load(name)]
    assert len(rows) >= 150
    assert sum(1 for e, _ in rows if e == "?") >= 20
    assert sum(1 for e, _ in rows if "," in e) >= 20  # cross-cutting, order checked
    assert {a for e, _ in rows if e != "?" for a in e.split(",")} == set(ALIAS)


@pytest.mark.parametrize("name", SETS)
def test_labelled_accuracy(name):
    rows = load(name)
    misses = [(e, q) for e, q in rows if not correct(e, q)]
    assert 1 - len(misses) / len(rows) >= 0.95, misses


def test_every_ambiguous_query_gets_exactly_one_question_and_no_route():
    for name in SETS:
        for e, q in load(name):
            if e == "?":
                a = matcher.triage(q)
                assert a.routes == [] and a.clarify in matcher.CLARIFY.values(), q


@pytest.mark.parametrize("q, question", [
    ("Fix my PyTorch training", "What specific issue? Memory? Speed? Accuracy? NaN?"),
    ("Optimize my model", "Optimize what? Training speed? Memory usage? Inference?"),
    ("Setup distributed training", "Single-node multi-GPU or multi-node? What's not working?"),
    ("Model not working", "What's broken? Training fails? Wrong outputs? Performance?"),
])
def test_the_routing_tables_ask_first_questions(q, question):
    a = matcher.triage(q)
    assert a.routes == [] and a.clarify == question


@pytest.mark.parametrize("q, first", [("OOM", "mem"), ("NCCL timeout", "dist"), ("nan", "debug"),
                                      ("Checkpoint", "ckpt"), ("slow", "perf"), ("AMP", "mp")])
def test_short_is_not_vague(q, first):
    assert routes(q)[:1] == [ALIAS[first]]


# Five baseline scenarios generic answers got wrong: the right route, and a playbook that covers
# what the generic answers missed.
BASELINES = [
    ("I'm getting CUDA out of memory errors when training my ResNet model on a single GPU. The error "
     "happens after a few batches. How do I fix this?", "mem",
     ["torchdoctor memory", "loss.item()", "appended to a list", "model size", "input dimensions",
      "mixed precision", "activation checkpointing", "gradient accumulation", "biggest term first",
      "expandable_segments"]),
    ("I need to scale my training to 8 GPUs using DistributedDataParallel. I'm not sure where to start. "
     "Can you help me set this up?", "dist",
     ["torchdoctor dist", "torchrun", "torch.distributed.launch", "env://", "tcp://", "file://",
      "DistributedSampler", "set_epoch", "seed", "model.eval()", "bucket_cap_mb", "find_unused_parameters",
      "all-reduces gradients", "no_sync", "every rank must call every collective"]),
    ("My training is really slow - only 5 iterations per second. I'm using PyTorch on a V100 GPU. How do I "
     "figure out what's slowing it down?", "perf",
     ["torchdoctor profile", "Measure first", "data wait", "torch.profiler", "num_workers",
      "before touching the model", "GPU model, batch size", "synchronise"]),
    ("My loss becomes NaN after epoch 3. The first few epochs look fine, then suddenly NaN. What's "
     "happening?", "debug",
     ["torchdoctor nan", "first module", "gradient norm", "Check the data", "set_detect_anomaly",
      "eps", "clip_grad_norm_", "learning rate"]),
    ("I need to save my model training state and be able to resume exactly where I left off. I also need "
     "results to be reproducible across runs. How do I do this properly?", "ckpt",
     ["torchdoctor checkpoint-audit", "optimizer.state_dict()", "scheduler.state_dict()",
      "scaler.state_dict()", "torch.get_rng_state()", "torch.cuda.get_rng_state_all()",
      "numpy.random.get_state()", "random.getstate()", "epoch and global step",
      "torch.use_deterministic_algorithms(True)", "cudnn.benchmark = False", "CUBLAS_WORKSPACE_CONFIG",
      "torch.manual_seed", "worker_init_fn"]),
]


@pytest.mark.parametrize("q, first, must_cover", BASELINES, ids=[b[1] for b in BASELINES])
def test_seed_baselines_route_and_playbook_cover_the_gaps(q, first, must_cover):
    a = matcher.triage(q)
    assert a.routes and a.routes[0].skill == ALIAS[first]
    text = " ".join(f"{s['text']} {s['by']}" for s in a.routes[0].to_dict()["steps_detail"])
    missing = [m for m in must_cover if m not in text]
    assert not missing, missing


@pytest.mark.parametrize("q, order", [
    ("OOM in distributed training", ["dist", "mem"]),
    ("NaN with AMP", ["debug", "mp"]),
    ("Custom layer slow", ["module", "perf"]),
    ("custom module with its own backward", ["module", "autograd"]),
    ("training is slow, should I use AMP?", ["perf", "mp"]),
    ("how do I use mixed precision to speed up training", ["perf", "mp"]),
    ("Save model", ["ckpt"]),
])
def test_cross_cutting_order_and_routing_mistakes(q, order):
    assert routes(q)[: len(order)] == [ALIAS[o] for o in order]


def test_why_names_the_words_and_the_order_rule():
    a = matcher.triage("CUDA out of memory with DDP on 4 GPUs")
    dist, mem = a.routes[0], a.routes[1]
    assert '"ddp"' in dist.why
    assert '"out of memory"' in mem.why and "after distributed-training-strategies" in mem.why


def test_playbooks_measure_first_and_name_who_performs_each_step():
    probes = {"torchdoctor profile", "torchdoctor memory", "torchdoctor nan", "torchdoctor dist",
              "torchdoctor checkpoint-audit", "torchdoctor checkup", "torchdoctor gradcheck"}
    assert set(PLAYBOOKS) == set(ALL_SKILLS)
    for pb in PLAYBOOKS.values():
        assert pb.steps[0].by != BY_HAND, pb.skill  # diagnosis before solutions
        for s in pb.steps:
            assert s.by == BY_HAND or any(s.by.startswith(p) for p in probes), (pb.skill, s.by)
        assert any(pb.probe.startswith(p) for p in probes)


def test_design_note_probe_names():
    want = {"performance-profiling": "torchdoctor profile SCRIPT", "tensor-operations-and-memory":
            "torchdoctor memory SCRIPT", "debugging-techniques": "torchdoctor nan SCRIPT",
            "distributed-training-strategies": "torchdoctor dist [SCRIPT]",
            "checkpointing-and-reproducibility": "torchdoctor checkpoint-audit PATH",
            "module-design-patterns": "torchdoctor checkup SCRIPT",
            "mixed-precision-and-optimization": "torchdoctor profile SCRIPT",
            "custom-autograd-functions": "torchdoctor gradcheck SCRIPT"}
    assert {k: v.probe for k, v in PLAYBOOKS.items()} == want


def test_precedence_rules_form_no_cycle():
    edges = {}
    for p in PRECEDENCE:
        edges.setdefault(p.first, set()).add(p.then)

    def reaches(a, b, seen=()):
        return any(n == b or (n not in seen and reaches(n, b, seen + (n,))) for n in edges.get(a, ()))

    assert not [p for p in PRECEDENCE if reaches(p.then, p.first)]


def test_routing_is_deterministic():
    q = "my ddp job OOMs and then the loss is nan with fp16"
    assert matcher.triage(q).to_dict() == matcher.triage(q).to_dict()


@pytest.mark.parametrize("typo, fix", [("memroy", "memory"), ("distirbuted", "distributed"),
                                       ("checkpiont", "checkpoint"), ("reproducable", "reproducible"),
                                       ("dataloder", "dataloader"), ("gradiant", "gradient"),
                                       ("precison", "precision"), ("traning", "training")])
def test_typos_are_read_and_shown(typo, fix):
    text, fixes = correct_typos(normalize(f"my {typo} problem"))
    assert fix in text.split() and (typo, fix) in fixes


def test_common_words_are_never_rewritten():
    words = ("notes codes modes nodes memo memoir lower flower slower trading raining gradual graduate "
             "precise decision division revision position function functions working worker network "
             "checking reserve reserves reverse allocation located relocate climbing increasing "
             "unstable dataset profile profiles profiled training trainer trained backwards forward "
             "initial initialize python pytorch iteration iterations torchvision tensorboard "
             "reproduced resumed assuming pretrain explosive function documentation distribute "
             "attribute contributed distributes memorize memories differential difference "
             "deterministic determine autocast broadcast podcast forecast").split()
    text, fixes = correct_typos(" ".join(words))
    wrong = [(a, b) for a, b in fixes if a != b]
    assert not wrong, wrong


def test_every_typo_target_is_a_word_the_patterns_use():
    sources = " ".join(s.pattern for s in SIGNALS) + " " + " ".join(p for _, p in matcher._VAGUE)
    for t in TYPO_TARGETS:
        assert t[:4] in sources or any(re.search(s.pattern, t) for s in SIGNALS), t


def test_gates_never_change_a_result():
    """The literal gates only skip compiling patterns that cannot match (gate.py)."""
    texts = [q for name in SETS for _, q in load(name)]
    texts += [k.sample for k in KNOWN] + [s.label for s in SIGNALS]
    texts += [st.text for pb in PLAYBOOKS.values() for st in pb.steps]
    for t in texts:
        gated, _ = matcher.match_query(t, gated=True)
        full, _ = matcher.match_query(t, gated=False)
        assert [(m.label, m.text) for m in gated] == [(m.label, m.text) for m in full], t


@pytest.mark.parametrize("pattern, gate", [
    (r"\bfoo(?:bar|baz)\b", {"foo"}),
    (r"\b(?:alpha|beta)\s+gamma", {"gamma"}),
    (r"ab?cde|x(?:yyy|zzz)", {"cde", "yyy", "zzz"}),
    (r"\bo\.?o\.?m\b", None),
    (r"colou?r", {"colo"}),
    (r"\b\w+\.pth\b", {".pth"}),
    (r"abc{0,3}de", None),
    (r"x(?!abcd)y", None),
])
def test_gate_extraction(pattern, gate):
    g = required_literals(pattern)
    assert (set(g) if g is not None else None) == gate
