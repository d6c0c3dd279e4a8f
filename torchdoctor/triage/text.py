"""Text normalisation and typo correction for symptom matching.

``normalize`` lower-cases, unifies quotes/dashes and collapses blanks. ``correct_typos`` fixes
misspelt technical words ("memroy", "distirbuted", "checkpiont") against a small list of targets
with the optimal-string-alignment (Damerau-Levenshtein) distance: at most 1 edit for words of 6-8
letters, 2 for longer ones. Only tokens of 6+ letters are considered, so short English words are
never rewritten; a known word, or another form of the same stem ("reserves" vs "reserved"), is
left alone.
"""

from __future__ import annotations

import re

_TRANS = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
                        "\u2014": "-", "\u00a0": " ", "\t": " "})
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_WORD = re.compile(r"[a-z][a-z]+")

# Targets for typo correction: long technical words users misspell. Each must be a word the
# symptom patterns look for (tests check that every target appears in some pattern's source).
TYPO_TARGETS = (
    "memory", "allocate", "allocated", "reserved", "leaking", "increasing", "climbing",
    "gradient", "gradients", "exploding", "explosion", "vanishing", "diverging", "unstable",
    "distributed", "torchrun",
    "checkpoint", "checkpoints", "checkpointing", "reproducible", "reproducibility", "reproduce",
    "deterministic", "resuming", "pretrained",
    "dataloader", "throughput", "utilization", "bottleneck", "profiler", "profiling", "iterations",
    "training", "precision", "autocast", "bfloat16", "float16",
    "autograd", "function", "backward", "differentiable", "initialization", "initialize",
    "working",
)

# Words near a target that must never be rewritten (real words, or tokens of their own meaning).
KNOWN_WORDS = frozenset((
    "allocation", "allocator", "reserve", "function", "functions", "functional", "training", "trainer",
    "trained", "raining", "working", "worker", "workers", "network", "gradual", "graduate", "precise",
    "decision", "division", "revision", "position", "backwards", "forward", "forwards", "profile",
    "profiles", "profiled", "checkpointed", "distribute", "distribution", "contributed", "attributed",
    "iteration", "memorize", "memories", "memorial", "reproduced", "reproduces", "resumed", "resumes",
    "resume", "assuming", "pretrain", "increased", "increases", "climbed", "leaked", "unstable",
    "initial", "initialized", "initializer", "utilisation", "utilization", "throughputs",
    "explosive", "explodes", "exploded", "diverged", "diverges", "vanishes", "vanished",
    "checking", "dataset", "datasets", "autocasting", "determinism", "nondeterministic",
))


def strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)


def normalize(s: str) -> str:
    """Lower-case, unify quotes and dashes, drop ANSI codes, collapse runs of blanks."""
    s = strip_ansi(s).translate(_TRANS).lower()
    return re.sub(r"[ \r\f\v]+", " ", s).strip()


def osa_distance(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance between ``a`` and ``b``; returns limit+1 once exceeded."""
    la, lb = len(a), len(b)
    if abs(la - lb) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(lb + 1))
    for i in range(1, la + 1):
        cur = [i] + [0] * lb
        row_min = cur[0]
        ca = a[i - 1]
        for j in range(1, lb + 1):
            cost = 0 if ca == b[j - 1] else 1
            v = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == b[j - 1]:
                v = min(v, prev2[j - 2] + 1)
            cur[j] = v
            row_min = min(row_min, v)
        if row_min > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[lb]


def _max_edits(word: str) -> int:
    return 1 if len(word) <= 8 else 2


_TARGETS = frozenset(TYPO_TARGETS)


def _best_target(tok: str) -> str | None:
    limit = _max_edits(tok)
    best, best_d, tie = None, limit + 1, False
    for t in TYPO_TARGETS:
        if abs(len(t) - len(tok)) > limit or (t[0] != tok[0] and t[1] != tok[1]):
            continue
        lim = min(limit, _max_edits(t))
        d = osa_distance(tok, t, lim)
        if d > lim:
            continue
        if d < best_d:
            best, best_d, tie = t, d, False
        elif d == best_d:
            tie = tie or t != best
    return None if tie or best_d > limit else best


def _inflection(tok: str, target: str) -> bool:
    """Same stem, different ending ("reserves"/"reserved", "differential"/"differentiable"):
    another word or form, not a typo. Typos land inside the word."""
    n = 0
    for a, b in zip(tok, target):
        if a != b:
            break
        n += 1
    if n < min(len(tok), len(target)) - 2:
        return False
    a, b = tok[n:], target[n:]
    return not (a.endswith(b) or b.endswith(a))  # "precison"/"precision": a dropped letter is a typo


MAX_FUZZY_WORDS = 400  # distinct words compared with the targets per query: a budget, not a limit of sense


def correct_typos(norm: str) -> tuple[str, list[tuple[str, str]]]:
    """Rewrite misspelt target words in normalised text; returns (text, [(typo, fix), ...]).

    At most MAX_FUZZY_WORDS distinct candidate words are compared (the caller caps the text too).
    """
    fixes: list[tuple[str, str]] = []
    cache: dict[str, str | None] = {}

    def repl(m: re.Match) -> str:
        tok = m.group(0)
        if len(tok) < 6 or len(tok) > 40 or tok in _TARGETS or tok in KNOWN_WORDS:
            return tok
        if tok not in cache:
            cache[tok] = _best_target(tok) if len(cache) < MAX_FUZZY_WORDS else None
        fix = cache[tok]
        if fix is None or _inflection(tok, fix):
            return tok
        if (tok, fix) not in fixes:
            fixes.append((tok, fix))
        return fix

    return _WORD.sub(repl, norm), fixes
