"""Untrusted text made safe to print: control bytes shown visibly, never parsed as markup.

Everything that comes from a file (checkpoint keys, values, global names, metadata) or from a
script (its output tail, exception messages, paths) is *data*. Printed raw, an ``ESC[1A ESC[2K``
inside a checkpoint key erases the lines above it (a safety warning among them), and a ``[/x]``
inside a ``str`` cell crashes rich's markup parser. So every renderer passes such strings
through :func:`visible` and builds :class:`rich.text.Text` from them, never markup.

C0 controls (``\\x00``-``\\x1f``), DEL and C1 controls (``\\x80``-``\\x9f``) become ``\\xNN``
escapes; with ``keep_newlines`` a multi-line text (a traceback, an output tail) keeps its
``\\n`` and ``\\t``. Unicode bidi overrides (which reorder what the eye reads) are escaped too, and
so are lone surrogates (``\\ud800``-``\\udfff``: a file name that is not valid UTF-8 decodes to them
under ``surrogateescape``, a pickle can hold them): no encoder can write them, so one of them
reaching a stream or a file written as UTF-8 would raise and lose the whole report.

:func:`harden_stream` is the second line of defence: every output stream torchdoctor writes to
(stdout, stderr) encodes with ``backslashreplace``, so a string that escaped :func:`visible` is
still written, as an escape, never raised on.
"""

from __future__ import annotations

import re
from typing import Any

_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"
_SURROGATES = "\ud800-\udfff"
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + _SURROGATES + "]")
_CONTROLS_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + _SURROGATES + "]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(value: Any, keep_newlines: bool = False) -> str:
    """``str(value)`` with every control character shown as an escape (``\\x1b``)."""
    s = value if isinstance(value, str) else str(value)
    pattern = _CONTROLS_KEEP_LINES if keep_newlines else _CONTROLS
    return pattern.sub(_escape, s)


def safe_text(value: Any, style: str = "", keep_newlines: bool = False):
    """A rich ``Text`` of untrusted ``value``: escaped controls, no markup parsing."""
    from rich.text import Text

    return Text(visible(value, keep_newlines=keep_newlines), style=style)


def has_controls(value: str) -> bool:
    """True when ``value`` holds a byte :func:`visible` would escape (tests, fuzzers)."""
    return bool(_CONTROLS.search(value))


_JSON_UNSAFE = re.compile("[\x7f-\x9f" + _BIDI + _SURROGATES + "]")


def json_visible(text: str) -> str:
    """JSON text with DEL, C1 and bidi controls written as ``\\uXXXX`` escapes.

    ``json.dumps`` escapes C0 itself; with ``ensure_ascii=False`` it leaves DEL, C1 (``\\x9b`` is
    a one-byte CSI on some terminals), bidi overrides and lone surrogates raw (the last cannot be
    encoded as UTF-8 at all). Inside a JSON string literal the ``\\u`` form decodes to the same
    character, so the document stays faithful (a strict parser may read a lone ``\\ud800`` as
    U+FFFD; Python's reads it back exactly).
    """
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


# the error handler of every stream and file torchdoctor writes text to: it cannot raise
OUTPUT_ERRORS = "backslashreplace"


def harden_stream(stream: Any) -> None:
    """Make ``stream`` (a text stream: stdout, stderr) write what it cannot encode as escapes.

    Encoding keeps the stream's own (UTF-8 on any modern locale); only the error handler changes,
    to ``backslashreplace``, which cannot raise. A stream without ``reconfigure`` (a test's
    ``StringIO``) cannot fail to encode and is left as it is."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is None:
        return
    try:
        reconfigure(errors=OUTPUT_ERRORS)
    except (ValueError, OSError, TypeError, AttributeError):  # closed or detached: nothing to write to
        pass


def harden_output() -> None:
    """:func:`harden_stream` on ``sys.stdout`` and ``sys.stderr`` (as they are now)."""
    import sys

    harden_stream(sys.stdout)
    harden_stream(sys.stderr)

