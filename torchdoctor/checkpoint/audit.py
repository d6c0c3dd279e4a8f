"""The checkpoint audit's options and its safe read (the measuring side of ``checkpoint-audit``).

The audit itself — read → (optional unsafe load) → roles → scan → evidence → judge → Report — is
:mod:`torchdoctor.pipeline.checkpoint`: the evidence (``evidence.py``) carries what was read and
the facts derived from it once (``derive.py``); the rules of probe ``checkpoint-audit``
(``torchdoctor/rules/checkpoint_*.py``) judge it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from torchdoctor.checkpoint.errors import Unreadable

EXPECT = ("auto", "resume", "weights")


@dataclass
class Options:
    expect: str = "auto"
    model: str | None = None
    unsafe_load: bool = False
    scan: bool = True


def read(path: str, seen: list):
    """The reader, with every failure it can have on crafted bytes turned into :class:`Unreadable`."""
    from torchdoctor.checkpoint import reader
    from torchdoctor.checkpoint.values import brief
    from torchdoctor.errors import DoctorError

    try:
        return reader.read(path)
    except (Unreadable, DoctorError):
        raise
    except RecursionError:
        raise Unreadable("unreadable checkpoint", "structure nested too deeply (or referring to itself) to read",
                         path) from None
    except MemoryError:
        raise Unreadable("unreadable checkpoint", "reading it needs more memory than torchdoctor allows",
                         path) from None
    except OSError as e:
        raise Unreadable("unreadable checkpoint", f"{type(e).__name__}: {e.strerror or brief(str(e), 200)}",
                         path) from None
    except Exception as e:  # noqa: BLE001 - crafted input can provoke anything in a parser
        raise Unreadable("unreadable checkpoint", f"{type(e).__name__}: {brief(str(e), 200)}", path) from None


def warn_unsafe() -> None:
    print("torchdoctor: warning: --unsafe-load unpickles the checkpoint with weights_only=False: any code it "
          "carries RUNS NOW, with your permissions. Use it only on files you made or fully trust.",
          file=sys.stderr, flush=True)
