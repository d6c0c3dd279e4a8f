"""Find the decisive line of a log or traceback, and what else it shows.

Order of decision: an out-of-memory line (the last one) beats everything; otherwise the last
error event - the last exception line, or a known error text after it (an NCCL watchdog abort
has no Python exception); a wrapper (torchrun's ChildFailedError, "Caught X in DataLoader worker")
defers to the error it wraps; without an error, the first NaN/Inf in the training output; then
the last known warning. Cost: one lower-cased copy of the text, one ``str.find`` scan per known
key, two regex passes; a 10,000-line log takes milliseconds.

Hostile input is bounded: an entry's regex sees at most ``MATCH_CAP`` characters of a line (around
its key) and of each line it wraps onto, so a 1 MB line costs what a 4 KB one does; numbers and the
user's frame are worked out only for the lines reported, not for every matching line; each line is
tested once for metric words when looking for the first NaN. With the ``errortext`` patterns bounded
(tested), every scan is linear in the input.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field

from torchdoctor.errortext.match import per_line
from torchdoctor.errortext.table import KNOWN, Known
from torchdoctor.errortext.numbers import MAX_DIGITS, TooLarge, extract, to_int
from torchdoctor.triage.text import strip_ansi

OOM_IDS = frozenset({"cuda-oom", "cuda-runtime-oom", "cpu-alloc-failed", "mps-oom"})
WRAPPER_EXCEPTIONS = frozenset({"ChildFailedError", "SignalException", "ProcessRaisedException",
                                "ProcessExitedException"})
WINDOW_LINES = 4  # a message may wrap onto the next lines (state_dict keys, OOM text in some loggers)
MAX_LINE = 600  # characters of a line quoted back
MATCH_CAP = 4096  # characters of a line an entry's regex sees (around its key on a longer line)
MATCH_BEFORE = 1024  # ... of which before the key
EXTRACT_CAP = 65536  # characters of a line the number extractors see (long state_dict key lists)
WHERE_LINES = 200  # how far above an error its user frame is looked for

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
    match: re.Match | None = field(default=None, repr=False)  # the entry's match (numbers are read later)
    completed: bool = field(default=False, repr=False)  # numbers and where filled in
    index: int | None = field(default=None, repr=False)  # line index in the scanned text (set by scan)

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
    text: _Text | None = field(default=None, repr=False)  # the split text (frames, for ``refine``)


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
        self.starts = [0, *itertools.accumulate(len(ln) + 1 for ln in self.lines[:-1])]
        self._frames: list[Frame] | None = None
        self._frame_idx: list[int] = []

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos) - 1

    def window(self, i: int, cap: int = EXTRACT_CAP) -> str:
        return "\n".join(ln[:cap] for ln in self.lines[i:i + WINDOW_LINES])

    def match_window(self, i: int, pos: int) -> tuple[str, int]:
        """What an entry's regex sees for the key at ``pos`` on line ``i``, and where line i ends in it."""
        line = self.lines[i]
        if len(line) > MATCH_CAP:
            a = max(0, min(pos - self.starts[i] - MATCH_BEFORE, len(line) - MATCH_CAP))
            line = line[a:a + MATCH_CAP]
        rest = [ln[:MATCH_CAP] for ln in self.lines[i + 1:i + WINDOW_LINES]]
        return "\n".join([line, *rest]), len(line)

    def frames(self) -> list[Frame]:
        """Every traceback frame line (``File "...", line N, in fn``), in order (computed once)."""
        if self._frames is None:
            out: list[Frame] = []
            pos = self.text.find('File "')
            while pos != -1:
                i = self.line_of(pos)
                m = _re("frame").search(self.lines[i][:MATCH_CAP])
                if m:
                    code = self.lines[i + 1].strip()[:MAX_LINE] if i + 1 < len(self.lines) else ""
                    out.append(Frame(i, m.group("file"), m.group("line"), m.group("fn"), code,
                                     not _re("lib").search(m.group("file"))))
                nxt = self.starts[i + 1] if i + 1 < len(self.starts) else len(self.text)
                pos = self.text.find('File "', nxt)
            self._frames = out
            self._frame_idx = [f.index for f in out]
        return self._frames

    def frames_above(self, i: int, lines: int = WHERE_LINES):
        """Frames on lines i, i-1, ... down to i-lines+1: the nearest first."""
        frames = self.frames()
        k = bisect.bisect_right(self._frame_idx, i) - 1
        while k >= 0 and frames[k].index > i - lines:
            yield frames[k]
            k -= 1


@dataclass(frozen=True)
class Frame:
    """One frame of a pasted Python traceback."""

    index: int  # line index of the `File "..."` line
    file: str
    line: str
    fn: str
    code: str  # the source line printed under it ("" when absent)
    user: bool  # not in site-packages / the standard library / torch

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line} in {self.fn}"


def _quote(s: str) -> str:
    s = s.strip()
    return s if len(s) <= MAX_LINE else s[:MAX_LINE] + " …"


def _known_hits(t: _Text) -> dict[int, tuple[int, Known, re.Match]]:
    """Per line index: (entry order, entry, match) of the first entry (in KNOWN order) matching there."""
    return per_line(t, KNOWN)


def _where(t: _Text, i: int) -> str | None:
    """The nearest frame of the user's own code above line ``i`` (within WHERE_LINES lines)."""
    f = user_frame(t, i)
    return f.where if f else None


def user_frame(t: _Text, i: int) -> Frame | None:
    return next((f for f in t.frames_above(i) if f.user), None)


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
    tested: set[int] = set()  # lines already tested for metric words (each line at most once)
    for word in ("nan", "inf"):
        for pos in _nan_positions(t.lower, word):
            if first is not None and pos >= first:
                break
            i = t.line_of(pos)
            if i in skip or i in tested:
                continue
            tested.add(i)
            if not _re("metric").search(t.lower, t.starts[i], t.starts[i] + min(len(t.lines[i]), MATCH_CAP)):
                continue
            first = pos
            break
    if first is None:
        return None
    i = t.line_of(first)
    line = t.lines[i]
    nums: dict = {}
    for sm in _re("step").finditer(line[:MATCH_CAP]):
        try:
            nums.setdefault(sm.group("k").lower(), to_int(sm.group("v")))
        except TooLarge:
            pass
    for j in range(i - 1, max(-1, i - 50), -1):  # the last finite loss before it
        lm = _re("loss").search(t.lines[j][:MATCH_CAP])
        if lm:
            v = lm.group("v")
            if len(v) <= MAX_DIGITS * 2:
                x = float(v)
                if x == x and abs(x) != float("inf"):
                    nums["last_finite_loss"] = x
                    nums["last_finite_line"] = j + 1
            break
    return Hit(i + 1, _quote(line), "nan", None, nums)


def _hit(t: _Text, i: int, k: Known, m: re.Match) -> Hit:
    """A recognised line; its numbers and user frame are filled in by ``_complete`` if reported."""
    kind = "oom" if k.id in OOM_IDS else ("warning" if k.severity == "warning" else "error")
    return Hit(i + 1, _quote(t.lines[i]), kind, k, {}, None, match_len=m.end() - m.start(), match=m)


def _complete(t: _Text, h: Hit | None) -> None:
    if h is None or h.completed:
        return
    h.completed = True
    i = h.line_no - 1
    if h.entry is not None and h.match is not None:
        h.numbers = extract(h.entry.numbers, t.window(i), h.match)
    if h.kind != "nan" and h.where is None:
        h.where = _where(t, i)


def scan(text: str, nan: bool = True, gap: tuple[int, int] | None = None) -> Scan:
    """Scan ``text``; ``nan=False`` skips the first-NaN search (a question, not a training log).

    ``gap``: (line index, n) when the line at that index stands for n lines that were not read
    (a capped stdin); the line numbers reported after it count them.
    """
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
        last_exc = hits.get(i) or Hit(i + 1, _quote(t.lines[i]), "exception", None, {})
    first_nan = _nan_hit(t, set(hits) | {i for i, _ in exc_lines}) if nan else None
    decisive = _decide(t, hits, exc_lines, first_nan)
    known = sorted(first.values(), key=lambda h: h.line_no)
    reported = {id(h): h for h in (*known, decisive, first_nan, last_exc) if h is not None}
    for h in reported.values():
        _complete(t, h)
        h.index = h.line_no - 1
    n_lines = len(t.lines)
    if gap is not None:
        g, skipped = gap
        for h in reported.values():
            if h.line_no - 1 > g:
                h.line_no += skipped - 1
        n_lines += skipped - 1
    return Scan(n_lines, decisive, known, counts, first_nan, last_exc, t.lower, t)


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
            exc = Hit(i + 1, _quote(t.lines[i]), "exception", None, {})
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
                return h or Hit(i + 1, _quote(t.lines[i]), "exception", None, {})
    return None
