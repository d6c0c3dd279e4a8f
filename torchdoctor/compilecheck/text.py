"""Reading dynamo's own messages into fields: pure text functions (no torch, no I/O).

Dynamo (torch 2.4–2.13) writes three kinds of message that ``torchdoctor compile`` reads
(captured by the ``dynamo_diag`` instrument from dynamo's loggers, never printed):

* a graph break (artifact ``graph_breaks``)::

      Graph break in user code at /path/train.py:41
      Graph Break Reason: Failed to handle graph break gracefully. Skipping the function ...

      Unsupported Tensor.item() call with capture_scalar_outputs=False
        Explanation: Dynamo does not support tracing `Tensor.item()` ...
        Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` ...
       For more details about this graph break, please visit: https://.../gb/gb0124.html
      User code traceback:
        File "/path/train.py", line 41, in forward

  or its short form for a repeat ("Graph break (user stack suppressed due to duplicate graph
  break) in user code at FILE:LINE\\nGraph Break Reason: ...");
* a recompile (artifact ``recompiles``)::

      Recompiling function forward in /path/train.py:30
          triggered by the following guard failure(s):
          - 1/0: self.level == 0   # return x * self.level  # path/train.py:31 in forward (HINT: ...)
          - User stack trace:
          -   File "/path/train.py", line 31, in forward

* the recompile limit (a warning of ``torch._dynamo.convert_frame``)::

      torch._dynamo hit config.recompile_limit (8)
         function: 'forward' (/path/train.py:30)
         last reason: 1/7: self.level == 7  # ...

Every function returns plain dicts; a message it cannot read gives the fields it could.
"""

from __future__ import annotations

import re
from typing import Any

MAX_TEXT = 600  # longest reason/guard kept

_BREAK_AT = re.compile(r"Graph break(?: \(user stack suppressed[^)]*\))? in user code at "
                       r"(?P<file>.+?):(?P<line>\d+)\s*$", re.M)
_REASON = re.compile(r"^Graph Break Reason:\s*(?P<reason>.*)$", re.M)
_SKIP_FRAME = re.compile(r"Skipping the (?:function|frame) and falling back to eager|"
                         r"skip tracing the frame|graph break in loop|cannot properly resume",
                         re.I)
_GB = re.compile(r"https?://\S*/(?P<gb>gb\d{3,5})(?:\.html)?")
_EXPLANATION = re.compile(r"^\s*Explanation:\s*(?P<x>.+)$", re.M)
_HINT = re.compile(r"^\s*Hint:\s*(?P<x>.+)$", re.M)
_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>[\w<>.]+))?')
_PREAMBLE = re.compile(r"^(Encountered graph break when attempting to trace|Failed to handle "
                       r"graph break gracefully|Graph break under|Graph break: )", re.I)
_RECOMPILE_FN = re.compile(r"Recompiling function (?P<fn>\S+) in (?P<file>.+?):(?P<line>\d+)\s*$",
                           re.M)
_GUARD = re.compile(r"^\s*-\s*(?:\d+/\d+:\s*)?(?P<guard>(?!User stack)(?!\s*File ).+?)"
                    r"(?:\s{2,}#.*)?$", re.M)
_LIMIT = re.compile(r"torch\._dynamo hit config\.(?P<name>\w+) \((?P<value>\d+)\)")
_LIMIT_FN = re.compile(r"function: '(?P<fn>[^']*)' \((?P<file>.+?):(?P<line>\d+)\)")
_LAST_REASON = re.compile(r"last reason:\s*(?:\d+/\d+:\s*)?(?P<guard>.+?)(?:\s{2,}#.*)?$", re.M)


def _cut(s: str | None, n: int = MAX_TEXT) -> str | None:
    if s is None:
        return None
    s = s.strip()
    return s if len(s) <= n else s[: n - 1] + "…"


def user_frames(text: str, is_user=None) -> list[tuple[str, int, str | None]]:
    out = []
    for m in _FILE_LINE.finditer(text):
        f = m.group("file")
        if is_user is None or is_user(f):
            out.append((f, int(m.group("line")), m.group("fn")))
    return out


def parse_graph_break(msg: str, is_user=None) -> dict[str, Any]:
    """Fields of one graph-break message: file, line (the user's, when dynamo's location is in a
    library: the innermost user frame of its traceback), reason (plain words: dynamo's
    explanation, else the first line of its reason), what (the break's one-line title), hint,
    gb and url (the graph-break page), skip (dynamo skipped the whole frame: eager)."""
    out: dict[str, Any] = {}
    m = _BREAK_AT.search(msg)
    if m:
        out["file"], out["line"] = m.group("file"), int(m.group("line"))
    if is_user is not None and out.get("file") and not is_user(out["file"]):
        frames = user_frames(msg.split("User code traceback:", 1)[-1], is_user)
        if frames:
            out["file"], out["line"] = frames[-1][0], frames[-1][1]
    body = msg.split("User code traceback:", 1)[0]
    what = None
    r = _REASON.search(body)
    if r:
        rest = body[r.start("reason"):].splitlines()
        for ln in rest:
            t = ln.strip()
            if t and not _PREAMBLE.match(t) and not t.startswith(("Explanation:", "Hint:")):
                what = t
                break
    out["what"] = _cut(what)
    x = _EXPLANATION.search(body)
    out["reason"] = _cut(x.group("x") if x else what)
    h = _HINT.search(body)
    out["hint"] = _cut(h.group("x")) if h else None
    g = _GB.search(body)
    if g:
        out["gb"], out["url"] = g.group("gb"), g.group(0).rstrip(".")
    out["skip"] = bool(_SKIP_FRAME.search(body))
    out["duplicate"] = "user stack suppressed" in msg
    return out


def parse_recompile(msg: str, is_user=None) -> dict[str, Any]:
    """Fields of one recompile message: function, file, line (the function's first line), guard
    (the first failed guard, e.g. ``self.level == 3``), user_file/user_line (where the guarded
    value is read, from dynamo's user stack trace)."""
    out: dict[str, Any] = {}
    m = _RECOMPILE_FN.search(msg)
    if m:
        out.update(function=m.group("fn"), file=m.group("file"), line=int(m.group("line")))
    tail = msg.split("triggered by the following guard failure(s):", 1)[-1]
    g = _GUARD.search(tail)
    out["guard"] = _cut(g.group("guard")) if g else None
    frames = user_frames(tail, is_user)
    if frames:
        out["user_file"], out["user_line"] = frames[0][0], frames[0][1]
    return out


def parse_limit(msg: str, is_user=None) -> dict[str, Any] | None:
    """Fields of the recompile-limit warning, or None when ``msg`` is not one: limit (config
    name), value, function, file, line, guard (the last failed guard), user_file/user_line."""
    m = _LIMIT.search(msg)
    if not m:
        return None
    out: dict[str, Any] = {"limit": m.group("name"), "value": int(m.group("value"))}
    f = _LIMIT_FN.search(msg)
    if f:
        out.update(function=f.group("fn"), file=f.group("file"), line=int(f.group("line")))
    r = _LAST_REASON.search(msg)
    out["guard"] = _cut(r.group("guard")) if r else None
    frames = user_frames(msg, is_user)
    if frames:
        out["user_file"], out["user_line"] = frames[0][0], frames[0][1]
    return out


def first_guard(reason: str | None) -> str | None:
    """The failed guard of a compile record's ``recompile_reason`` ("1/0: self.level == 0  # …")."""
    if not reason:
        return None
    first = reason.strip().splitlines()[0]
    m = re.match(r"(?:\d+/\d+:\s*)?(?P<guard>.+?)(?:\s{2,}#.*)?$", first)
    return _cut(m.group("guard")) if m else _cut(first)


def gb_of(text: str | None) -> tuple[str | None, str | None]:
    """(gb id, url) named in ``text`` (a graph-break or failure message)."""
    if not text:
        return None, None
    g = _GB.search(text)
    return (g.group("gb"), g.group(0).rstrip(".")) if g else (None, None)
