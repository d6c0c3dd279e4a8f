"""Find the decisive line of a log or traceback, and what else it shows.

Order of decision: an out-of-memory line (the last one) beats everything; otherwise the last
error event - the last exception line, or a known error text after it (an NCCL watchdog abort
has no Python exception); a wrapper (torchrun's ChildFailedError, "Caught X in DataLoader worker")
defers to the error it wraps; without an error, the first NaN/Inf in the training output; then
the last known warning. Cost: one lower-cased copy of the text, one ``str.find`` scan per known
key, two regex passes; a 10,000-line log takes milliseconds.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from torchdoctor.triage.errorkb import KNOWN, Known
from torchdoctor.triage.numbers import extract
from torchdoctor.triage.text import strip_ansi

OOM_IDS = frozenset({"cuda-oom", "cuda-runtime-oom", "cpu-alloc-failed", "mps-oom"})
WRAPPER_EXCEPTIONS = frozenset({"ChildFailedError", "SignalException", "ProcessRaisedException",
                                "ProcessExitedException"})
WINDOW_LINES = 4  # a message may wrap onto the next lines (state_dict keys, OOM text in some loggers)
MAX_LINE = 600  # characters of a line quoted back

_PATTERNS = {  # compiled on first use: a fresh process pays only for what it needs
    "exc": (r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_][\w]*\.)*(?P<name>[A-Z]\w*(?:Error|Exception|Interrupt|Exit|"
            r"Failure))(?::[ \t]*(?P<msg>.*))?$", re.M),
    "metric": (r"loss|grad|norm|step|iter|epoch|\blr\b|ppl|perplex|acc|tensor\(|scale|metric|[=:]\s*[-+]?"
               r"(?:nan|inf)\b", 0),
    "frame": (r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)', 0),
    "lib": (r"site-packages|dist-packages|/lib/python\d|<frozen |/torch/", 0),
    "step": (r"\b(?P<k>step|iter(?:ation)?|epoch|batch|it)\b\s*[:=#]?\s*\[?\s*(?P<v>\d+)", re.I),
    "loss": (r"\bloss\b\s*[:=]?\s*(?P<v>[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", re.I),
}
_RX: dict[str, re.Pattern] = {}


def _re(name: str) -> re.Pattern:
    rx = _RX.get(name)
    if rx is None:
        p, flags = _PATTERNS[name]
        rx = _RX[name] = re.compile(p, flags)
    return rx

@dataclass
class Hit:
    line_no: int  # 1-based
    text: str
    kind: str  # "oom" | "error" | "exception" | "nan" | "warning"
    entry: Known | None = None
    numbers: dict = field(default_factory=dict)
    where: str | None = None  # nearest frame of the user's code above the line (file:line in fn)
    via: str | None = None  # the wrapper line that pointed here, if any
    match_len: int = 0  # characters the entry's regex matched (how specific the text is)
    wrapped_by: Known | None = None  # a known wrapper above an unknown exception (DataLoader worker)

    @property
    def skill(self) -> str | None:
        return self.entry.skill if self.entry else None


@dataclass
class Scan:
    lines: int
    decisive: Hit | None
    known: list[Hit]  # first occurrence of each recognised entry, in line order
    counts: dict[str, int]  # occurrences per entry id
    first_nan: Hit | None
    last_exception: Hit | None
    lower: str = ""  # the whole text, lower-cased (for cheap marker searches)


class _Text:
    """The text split once, with line offsets for mapping a position to its line."""

    def __init__(self, text: str):
        if "\x1b" in text:
            text = strip_ansi(text)
        self.text = text.replace("\r\n", "\n").replace("\r", "\n")
        self.lower = self.text.lower()
        self.lines = self.text.split("\n")
        if len(self.lines) > 1 and self.lines[-1] == "":  # a final newline ends the last line
            self.lines.pop()
        self.starts = [0]
        acc = 0
        for ln in self.lines[:-1]:
            acc += len(ln) + 1
            self.starts.append(acc)

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos) - 1

    def window(self, i: int) -> str:
        return "\n".join(self.lines[i:i + WINDOW_LINES])


def _quote(s: str) -> str:
    s = s.strip()
    return s if len(s) <= MAX_LINE else s[:MAX_LINE] + " …"


def _known_hits(t: _Text) -> dict[int, tuple[int, Known, re.Match]]:
    """Per line index: (entry order, entry, match) of the first entry (in KNOWN order) matching there."""
    best: dict[int, tuple[int, Known, re.Match]] = {}
    for order, k in enumerate(KNOWN):
        if k.key not in t.lower:
            continue
        rx = k.regex()
        pos = t.lower.find(k.key)
        seen_line = -1
        while pos != -1:
            i = t.line_of(pos)
            if i != seen_line:
                seen_line = i
                if i not in best or best[i][0] > order:
                    win = t.window(i)
                    m = rx.search(win)
                    if m and m.start() <= len(t.lines[i]):
                        best[i] = (order, k, m)
            nxt = t.starts[i + 1] if i + 1 < len(t.starts) else len(t.lower)
            pos = t.lower.find(k.key, max(pos + 1, nxt))
    return best


def _where(t: _Text, i: int) -> str | None:
    """The nearest frame of the user's own code above line ``i`` (within 200 lines)."""
    for j in range(i, max(-1, i - 200), -1):
        m = _re("frame").search(t.lines[j])
        if m and not _re("lib").search(m.group("file")):
            return f"{m.group('file')}:{m.group('line')} in {m.group('fn')}"
    return None


def _nan_positions(lower: str, word: str, limit: int = 5000):
    """Offsets of ``word`` standing alone ("nan", "-inf"), not inside "nano" or "info" or "x.nan"."""
    pos, n = lower.find(word), 0
    while pos != -1 and n < limit:
        before = lower[pos - 1] if pos else " "
        after = lower[pos + len(word)] if pos + len(word) < len(lower) else " "
        if not (before.isalnum() or before in "_.") and not (after.isalnum() or after == "_"):
            yield pos
            n += 1
        pos = lower.find(word, pos + 1)


def _nan_hit(t: _Text, skip: set[int]) -> Hit | None:
    """The first line where a logged value is NaN/Inf (a metric line, not an error message)."""
    first = None
    for word in ("nan", "inf"):
        for pos in _nan_positions(t.lower, word):
            if first is not None and pos >= first:
                break
            i = t.line_of(pos)
            if i in skip or not _re("metric").search(t.lower, t.starts[i], t.starts[i] + len(t.lines[i])):
                continue
            first = pos
            break
    if first is None:
        return None
    i = t.line_of(first)
    line = t.lines[i]
    nums: dict = {}
    for sm in _re("step").finditer(line):
        nums.setdefault(sm.group("k").lower(), int(sm.group("v")))
    for j in range(i - 1, max(-1, i - 50), -1):  # the last finite loss before it
        lm = _re("loss").search(t.lines[j])
        if lm:
            nums["last_finite_loss"] = float(lm.group("v"))
            nums["last_finite_line"] = j + 1
            break
    return Hit(i + 1, _quote(line), "nan", None, nums)


def _hit(t: _Text, i: int, k: Known, m: re.Match) -> Hit:
    kind = "oom" if k.id in OOM_IDS else ("warning" if k.severity == "warning" else "error")
    return Hit(i + 1, _quote(t.lines[i]), kind, k, extract(k.numbers, t.window(i), m), _where(t, i),
               match_len=m.end() - m.start())


def scan(text: str, nan: bool = True) -> Scan:
    """Scan ``text``; ``nan=False`` skips the first-NaN search (a question, not a training log)."""
    t = _Text(text)
    best = _known_hits(t)
    hits = {i: _hit(t, i, k, m) for i, (_o, k, m) in sorted(best.items())}
    counts: dict[str, int] = {}
    first: dict[str, Hit] = {}
    for h in hits.values():
        counts[h.entry.id] = counts.get(h.entry.id, 0) + 1
        first.setdefault(h.entry.id, h)
    exc_lines = [(t.line_of(m.start()), m) for m in _re("exc").finditer(t.text)]
    last_exc = None
    if exc_lines:
        i, m = exc_lines[-1]
        last_exc = hits.get(i) or Hit(i + 1, _quote(t.lines[i]), "exception", None, {}, _where(t, i))
    first_nan = _nan_hit(t, set(hits) | {i for i, _ in exc_lines}) if nan else None
    decisive = _decide(t, hits, exc_lines, first_nan)
    return Scan(len(t.lines), decisive, sorted(first.values(), key=lambda h: h.line_no), counts, first_nan,
                last_exc, t.lower)


def _decide(t: _Text, hits: dict[int, Hit], exc_lines: list, first_nan: Hit | None) -> Hit | None:
    ooms = [h for h in hits.values() if h.kind == "oom"]
    if ooms:
        return ooms[-1]
    errors = [h for h in hits.values() if h.kind == "error"]
    primary = [h for h in errors if not h.entry.wrapper]  # a consequence defers to its cause
    last_err = (primary or errors)[-1] if errors else None
    if exc_lines:
        i, m = exc_lines[-1]
        exc = hits.get(i)
        if exc is None:  # an exception text the KB does not know; a known one may be on its next lines
            exc = next((hits[j] for j in range(i + 1, min(i + WINDOW_LINES, len(t.lines))) if j in hits
                        and hits[j].kind == "error"), None)
        if exc is None:
            exc = Hit(i + 1, _quote(t.lines[i]), "exception", None, {}, _where(t, i))
            wrapper = next((h for h in sorted(hits.values(), key=lambda h: -h.line_no)
                            if h.entry.wrapper and i - 100 <= h.line_no - 1 < i), None)
            if wrapper is not None:  # "Caught X in DataLoader worker process N" ... the original error
                exc.via, exc.wrapped_by = wrapper.text, wrapper.entry
        elif exc.entry is not None and exc.entry.generic:  # e.g. "Error(s) in loading state_dict" + details
            exc = next((hits[j] for j in range(exc.line_no, min(exc.line_no + WINDOW_LINES, len(t.lines)))
                        if j in hits and hits[j].kind == "error"), exc)
        if last_err is not None and last_err.line_no >= exc.line_no + WINDOW_LINES:
            return last_err  # a known error after the exception and not part of its message
        wrapped = exc.entry.wrapper if exc.entry else m.group("name") in WRAPPER_EXCEPTIONS
        if wrapped:
            inner = _inner(t, hits, exc_lines, exc)
            if inner is not None:
                inner.via = exc.text
                return inner
        return exc
    if last_err is not None:
        return last_err
    if first_nan is not None:
        return first_nan
    warnings = [h for h in hits.values() if h.kind == "warning"]
    return warnings[-1] if warnings else None


def _inner(t: _Text, hits: dict[int, Hit], exc_lines: list, wrapper: Hit) -> Hit | None:
    """What a wrapper wraps: the last non-wrapper error before it, known or not."""
    for h in sorted(hits.values(), key=lambda h: -h.line_no):
        if h.line_no < wrapper.line_no and h.kind in ("error", "oom") and not h.entry.wrapper:
            return h
    for i, m in reversed(exc_lines):
        if i + 1 < wrapper.line_no and m.group("name") not in WRAPPER_EXCEPTIONS:
            h = hits.get(i)
            if h is None or not h.entry.wrapper:
                return h or Hit(i + 1, _quote(t.lines[i]), "exception", None, {}, _where(t, i))
    return None
