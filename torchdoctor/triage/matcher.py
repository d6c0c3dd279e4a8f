"""Route a query or a log: symptoms + known error texts -> ordered routes with their why.

1. Known error texts (``errortext``, the rows with ``ask``) and the decisive line (``logscan``) are found in any input.
2. A question (not a log) is normalised, typos fixed, and matched against ``symptoms.SIGNALS``.
   A log is not read as prose (its words would route everywhere); only strong markers of a
   distributed or mixed-precision run add context.
3. No specific evidence (only generic words, or none) -> exactly one clarifying question, no route.
4. Otherwise skills are ranked (error > symptom > topic > context, then weight, then position)
   and ``order`` applies the precedence rules. At most three routes.
"""

from __future__ import annotations

import re

from torchdoctor.triage import order as order_mod
from torchdoctor.triage.answer import Answer, Decisive, Matched, Route
from torchdoctor.triage.gate import required_literals
from torchdoctor.triage.logscan import Hit, scan
from torchdoctor.errortext.numbers import oom_notes
from torchdoctor.triage.playbooks import PLAYBOOKS, VARIANTS
from torchdoctor.triage.refine import refine
from torchdoctor.triage.symptoms import DBG, DIST, ERROR_VARIANTS, MP, SIGNALS
from torchdoctor.triage.text import correct_typos, normalize

MAX_ROUTES = 3
LOG_MIN_LINES = 4
MAX_QUERY_CHARS = 4000  # a question's words are read up to here; known error texts in all of it
MAX_QUERY_SHOWN = 2000
WHERE_RAISED = "where it was raised"  # label of the evidence ``refine`` adds  # characters of a question echoed back (console and JSON)

_GATES: list | None = None
_RX: dict[str, re.Pattern] = {}


def _gates() -> list:
    global _GATES
    if _GATES is None:
        _GATES = [(s, required_literals(s.pattern)) for s in SIGNALS]
    return _GATES


def _rx(pattern: str) -> re.Pattern:
    rx = _RX.get(pattern)
    if rx is None:
        rx = _RX[pattern] = re.compile(pattern)
    return rx


def _signals(norm: str, gated: bool = True):
    """(signal, compiled regex) for each signal that can match ``norm`` (see ``gate``)."""
    for sig, gate in _gates():
        if gated and gate is not None and not any(g in norm for g in gate):
            continue
        yield sig, _rx(sig.pattern)


# Markers that say "this log comes from a distributed / mixed-precision run" (context only).
# Literal, lower-case; a trailing/leading space stands for a word boundary. Searched with str.find.
_LOG_CONTEXT = (
    (DIST, "distributed run", ("[rank", "torchrun", "processgroupnccl", "torch.distributed", "local_rank",
                               "world_size", "torch/distributed/elastic")),
    (MP, "mixed precision run", ("gradscaler", "autocast", " amp ", "fp16", "bf16", "float16", "loss scale")),
)


def _log_context(lower: str) -> list[Matched]:
    out = []
    for skill, label, markers in _LOG_CONTEXT:
        for mk in markers:
            if mk in lower:
                out.append(Matched(label, skill, "context", mk.strip(), 1, 10**9))
                break
    return out


# One clarifying question (the routing table's "Ask First"), chosen by the vague words used.
CLARIFY = {
    "distributed": "Single-node multi-GPU or multi-node? What's not working?",
    "crash": "What does the error say? Paste the traceback: torchdoctor ask - < log.txt",
    "broken": "What's broken? Training fails? Wrong outputs? Performance?",
    "optimize": "Optimize what? Training speed? Memory usage? Inference?",
    "fix": "What specific issue? Memory? Speed? Accuracy? NaN?",
    "default": "What do you see? An error message (paste it), slow steps, growing memory, NaN loss, or a hang?",
}
_VAGUE = (
    ("crash", r"\bcrash\w*|\bsegfault|\berrors?\b|\bexceptions?\b|\btraceback\b"),
    ("broken", r"\bnot\s+work\w*|\bdoesn'?t\s+work|\bisn'?t\s+working|\bbroken\b|\bfail\w*|\bwrong\b|"
               r"\bnot\s+right\b"),
    ("optimize", r"\boptimi[sz](?:e|es|ed|ing|ation)\b|\bimprove\w*|\bbetter\b|\btun(?:e|ing)\b|\befficien\w*"),
    ("fix", r"\bfix\w*|\bissues?\b|\bproblems?\b|\bbugs?\b|\bhelp\b|\btrouble\w*|\bsomething\b"),
)


# In a question (not a log), a known text counts only if it was pasted, not paraphrased:
# exception-shaped ("RuntimeError: ...", "[rank0]: ...", glog "E1105 ..."), or a long exact match.
_PASTED = (r"(?:^|[\s\[(])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Warning|Interrupt)\b|"
           r"^\[rank\s*\d+\]|^[EWIF]\d{4} |^\[[EWI] ")
PASTED_MIN_MATCH = 30


def _pasted(h: Hit) -> bool:
    return bool(_rx(_PASTED).search(h.text)) or h.match_len >= PASTED_MIN_MATCH


def looks_like_log(text: str) -> bool:
    """A traceback, or several non-empty lines (a question is one paragraph)."""
    if "Traceback (most recent call last)" in text:
        return True
    if text.count("\n") < LOG_MIN_LINES - 1:
        return False
    n = 0
    for ln in text.splitlines():
        if ln and not ln.isspace():
            n += 1
            if n >= LOG_MIN_LINES:
                return True
    return False


def match_query(text: str, gated: bool = True) -> tuple[list[Matched], list[tuple[str, str]]]:
    """Symptom signals in a question, in order of appearance; returns (matches, typo fixes)."""
    norm, fixes = correct_typos(normalize(text))
    work = norm
    found: list[Matched] = []
    for sig, rx in _signals(norm, gated):
        for m in rx.finditer(work):
            found.append(Matched(sig.label, sig.skill, sig.kind, m.group(0).strip(), sig.weight, m.start()))
            if sig.consume:
                work = work[:m.start()] + " " * (m.end() - m.start()) + work[m.end():]
    # "prefer": a generic symptom goes to the skill whose own words are also present
    present = {m.skill for m in found}
    by_label = {s.label: s for s in SIGNALS}
    for m in found:
        sig = by_label[m.label]
        for skill in sig.prefer:
            if skill in present - {m.skill} or any(o.skill == skill for o in found if o is not m):
                m.skill = skill
                break
    return found, fixes


def _error_match(h: Hit) -> Matched:
    k = h.entry
    return Matched(k.title, k.skill, "error", h.text, 5, h.line_no, h.line_no, k.id)


def _decisive(h: Hit) -> Decisive:
    if h.entry is not None:
        k = h.entry
        return Decisive(h.line_no, h.text, h.kind, k.id, k.title, k.skill, k.explain, k.first, h.where, h.via)
    if h.kind == "nan":
        return Decisive(h.line_no, h.text, "nan", None, "first NaN/Inf in the training output", DBG,
                        "The first logged value that is not finite; what comes after is a consequence.",
                        "Run `torchdoctor nan SCRIPT` to find the first module and step that produce it.",
                        None, h.via)
    if h.wrapped_by is not None:
        w = h.wrapped_by
        return Decisive(h.line_no, h.text, h.kind, w.id, w.title, w.skill, w.explain,
                        w.first + (f" Raised at {h.where}." if h.where else ""), h.where, h.via)
    return Decisive(h.line_no, h.text, h.kind, None, "an exception torchdoctor does not know", DBG,
                    "Not a known PyTorch/CUDA/NCCL text: most likely an error in your own code or data.",
                    "Open the last frame of your code in the traceback"
                    + (f" ({h.where})" if h.where else "") + "; `torchdoctor checkup SCRIPT` reruns a few "
                    "steps under watch.", h.where, h.via)


def _clarify_question(found: list[Matched], norm: str) -> str:
    weak = {m.skill for m in found}
    if DIST in weak:
        return CLARIFY["distributed"]
    if any(m.label == "debugging" and re.search(r"crash|segfault|segmentation", m.text) for m in found):
        return CLARIFY["crash"]
    for name, rx in _VAGUE:
        if _rx(rx).search(norm):
            return CLARIFY[name]
    return CLARIFY["default"]


def _why(skill: str, matched: list[Matched], corrections: list[tuple[str, str]], before: list) -> str:
    parts = []
    errors = [m for m in matched if m.kind == "error"]
    for m in errors[:1]:
        where = f"line {m.line}: " if m.line else ""
        parts.append(f"error text {where}\"{_short(m.text)}\" ({m.id}: {m.label})")
    if any(m.kind == "nan-line" for m in matched):
        m = next(m for m in matched if m.kind == "nan-line")
        parts.append(f"first NaN/Inf at line {m.line}: \"{_short(m.text)}\"")
    for m in matched:
        if m.label == WHERE_RAISED:
            parts.append(_short(m.text, 200))
    words = [m for m in matched if m.kind not in ("error", "nan-line") and m.label != WHERE_RAISED]
    seen = set()
    quoted = []
    for m in sorted(words, key=lambda m: (-m.weight, m.pos)):
        if (m.label, m.text) in seen:
            continue
        seen.add((m.label, m.text))
        quoted.append(f"\"{_short(m.text, 60)}\" ({m.label})")
    if quoted:
        parts.append("matched " + ", ".join(quoted[:4]))
    fixes = [f"\"{a}\" as \"{b}\"" for a, b in corrections if any(b in m.text for m in words)]
    if fixes:
        parts.append("read " + ", ".join(fixes))
    for p in before:
        parts.append(f"after {p.first}: {p.why}")
    return "; ".join(parts)


def _short(s: str, n: int = 120) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _cut(text: str, n: int) -> str:
    """``text`` up to ``n`` characters, cut at a blank when one is near."""
    if len(text) <= n:
        return text
    cut = text.rfind(" ", n - 200, n)
    return text[:cut if cut > 0 else n]


def triage(text: str, source: str = "args", gap: tuple[int, int] | None = None) -> Answer:
    """Route ``text``; ``gap`` = (line index, lines skipped) when a capped stdin left a gap there."""
    log_mode = looks_like_log(text)
    sc = scan(text, nan=log_mode, gap=gap)
    query = text.strip()
    if log_mode and len(text) > MAX_QUERY_SHOWN:
        query = f"- ({source}, {sc.lines} lines)"
    elif len(query) > MAX_QUERY_SHOWN:
        query = _cut(query, MAX_QUERY_SHOWN) + f" … ({len(query)} characters)"
    ans = Answer(query=query, source=source, mode="log" if log_mode else "query", lines=sc.lines)
    found: list[Matched] = []
    words = _cut(text, MAX_QUERY_CHARS)
    norm = normalize(words) if not log_mode else ""
    if log_mode:
        found.extend(_log_context(sc.lower))
    else:
        found, ans.corrections = match_query(words)
        if len(words) < len(text):
            ans.limits.append(f"a question of {len(text)} characters: its words were read up to character "
                              f"{len(words)} (known error texts in all of it)")
    # known error texts: all are recognised; the decisive one routes
    known, d = sc.known, sc.decisive
    if not log_mode:
        known = [h for h in known if _pasted(h)]
        if d is not None and d.entry is not None and not _pasted(d):
            d = None
    for h in known:
        ans.recognized.append(_error_match(h))
    if d is not None and d.entry is not None:
        refined = refine(d, sc, text)
        if refined is not None:  # where it was raised says whose problem it is
            d.entry, where_why = refined
            found.append(Matched(WHERE_RAISED, d.entry.skill, "context", where_why, 1, 10**9))
    if d is not None:
        ans.decisive = _decisive(d)
        ans.numbers = dict(d.numbers)
        if d.entry is not None and d.entry.numbers == "oom":
            ans.notes = oom_notes(d.numbers)
        if d.entry is not None:
            found.append(Matched(d.entry.title, d.entry.skill, "error", d.text, 5, -1, d.line_no, d.entry.id))
            for extra in d.entry.then:
                found.append(Matched(f"then, after {d.entry.id}", extra, "context", d.entry.title, 1, 10**9))
        elif d.wrapped_by is not None:
            w = d.wrapped_by
            found.append(Matched(w.title, w.skill, "error", d.text, 5, -1, d.line_no, w.id))
        elif d.kind == "nan":
            found.append(Matched("NaN / Inf in the log", DBG, "nan-line", d.text, 5, -1, d.line_no))
        else:
            found.append(Matched("unknown exception", DBG, "error", d.text, 4, -1, d.line_no))
    if log_mode and sc.first_nan and d is not sc.first_nan:
        ans.also.append({"line": sc.first_nan.line_no, "kind": "nan", "text": sc.first_nan.text,
                         **sc.first_nan.numbers})
    for h in known:
        if d is None or h.line_no != d.line_no:
            ans.also.append({"line": h.line_no, "kind": h.kind, "id": h.entry.id, "text": h.text,
                             "count": sc.counts.get(h.entry.id, 1)})
    ans.also = ans.also[:8]
    for m in sorted(found, key=lambda m: m.pos):
        if m.kind not in ("error", "nan-line"):
            ans.recognized.append(m)
    clear = any(m.weight >= 2 for m in found)
    if not clear:
        ans.clarify = _clarify_question(found, norm)
        return ans
    ans.routes = _routes(found, ans.corrections)
    return ans


def _routes(found: list[Matched], corrections: list[tuple[str, str]]) -> list[Route]:
    tiers = order_mod.TIERS
    info: dict[str, dict] = {}
    for m in found:
        tier = 0 if m.kind in ("error", "nan-line") else tiers[m.kind]
        e = info.setdefault(m.skill, {"tier": tier, "score": 0, "pos": m.pos, "matched": []})
        e["tier"] = min(e["tier"], tier)
        e["score"] += m.weight
        e["pos"] = min(e["pos"], m.pos)
        e["matched"].append(m)
    ranked = sorted(info, key=lambda s: (info[s]["tier"], -info[s]["score"], info[s]["pos"]))
    labels = {m.label for m in found}
    symptom_skills = {m.skill for m in found if m.kind in ("symptom", "error", "nan-line")}
    error_skills = {m.skill for m in found if m.kind == "error"}
    ordered, before = order_mod.order_skills(ranked, labels, symptom_skills, error_skills)
    routes = []
    for skill in ordered[:MAX_ROUTES]:
        pb = PLAYBOOKS[skill]
        variant = variant_of(info[skill]["matched"])
        if variant is not None and VARIANTS[variant].skill == skill:
            pb = VARIANTS[variant]
        rules = before.get(skill, [])
        routes.append(Route(skill, _why(skill, info[skill]["matched"], corrections, rules), pb.probe,
                            [{"text": s.text, "by": s.by} for s in pb.steps], info[skill]["matched"],
                            [p.why for p in rules], after=pb.after))
    return routes


def variant_of(matched: list[Matched]) -> str | None:
    """The playbook variant of a route: that of its strongest signal (the first in the query on a
    tie; a known error text's id in ``ERROR_VARIANTS``), if it has one ("torch.compile makes my model slower" -> compile; "save my training state
    ... and reproducible across runs" -> the checkpoint route stays: saving came first)."""
    by_label = {s.label: s for s in SIGNALS}
    ranked = sorted(matched, key=lambda m: (-m.weight, m.pos))
    if not ranked:
        return None
    if ranked[0].kind == "error":  # a known error text: its row says (errortext ids)
        return ERROR_VARIANTS.get(ranked[0].id or "")
    sig = by_label.get(ranked[0].label)
    return sig.variant if sig is not None else None
