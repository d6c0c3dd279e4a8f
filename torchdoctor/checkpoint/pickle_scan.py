"""List what a pickle would import, from its opcodes alone (nothing is unpickled).

``pickletools.genops`` decodes the opcodes; a small stack simulation keeps the values
that matter (strings, ints, tuples, the memo) so that protocol-4 ``STACK_GLOBAL`` names
are recovered too. A name that is computed at run time (never a literal) is reported
as ``<dynamic>``: refusing it is the only safe reading.
"""

from __future__ import annotations

import io
import pickletools
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING

from torchdoctor.checkpoint.allowlist import WEIGHTS_ONLY_OPS
from torchdoctor.checkpoint.values import PickleInfo

_MARK = object()
_ANY = object()
_STRING_OPS = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                         "SHORT_BINUNICODE", "BINUNICODE8"})
_INT_OPS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
_TELLTALE = frozenset({"_modules", "_parameters", "_buffers"})


class PickleScanError(ValueError):
    """The bytes are not a well-formed pickle (truncated, unknown opcode)."""


def _fix_name(module: str, name: str, proto: int | None) -> str:
    if proto is None or proto < 3:
        if (module, name) in NAME_MAPPING:
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
    return f"{module}.{name}"


def scan_pickle(data, name: str = "pickle") -> tuple[PickleInfo, int]:
    """Scan one pickle: ``data`` is bytes, or a binary file positioned at its first byte.

    Returns the :class:`PickleInfo` and the file offset just after its STOP opcode
    (legacy torch files are several pickles back to back). Raises :class:`PickleScanError`.
    """
    info = PickleInfo(name=name)
    seen: dict[str, None] = {}
    unsupported: dict[str, None] = {}
    kinds: dict[str, None] = {}
    stack: list = []
    memo: dict = {}
    end = 0
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        for op, arg, pos in pickletools.genops(src):
            nm = op.name
            if nm not in WEIGHTS_ONLY_OPS:
                unsupported[nm] = None
            if nm == "PROTO":
                info.protocol = int(arg)
            if nm == "STOP":
                end = pos + 1
                break
            _step(op, arg, stack, memo, seen, kinds, info)
        else:
            raise PickleScanError("pickle ends without a STOP opcode (truncated?)")
    except PickleScanError:
        raise
    except (ValueError, IndexError, KeyError, EOFError) as e:  # genops on bad bytes
        raise PickleScanError(str(e) or type(e).__name__) from None
    info.globals = list(seen)
    info.unsupported_ops = list(unsupported)
    info.persistent_kinds = list(kinds)
    return info, end


def _pop_to_mark(stack: list) -> list:
    items = []
    while stack:
        v = stack.pop()
        if v is _MARK:
            break
        items.append(v)
    items.reverse()
    return items


def _step(op, arg, stack: list, memo: dict, seen: dict, kinds: dict, info: PickleInfo) -> None:
    nm = op.name
    if nm in ("GLOBAL", "INST"):
        module, _, qual = str(arg).partition(" ")
        seen[_fix_name(module, qual, info.protocol)] = None
    elif nm == "STACK_GLOBAL":
        qual = stack.pop() if stack else _ANY
        module = stack.pop() if stack else _ANY
        if isinstance(module, str) and isinstance(qual, str):
            seen[f"{module}.{qual}"] = None
        else:
            seen["<dynamic>"] = None
        stack.append(_ANY)
        return
    elif nm.startswith("EXT"):
        seen[f"<copyreg extension {arg}>"] = None
    elif nm in ("MEMOIZE",):
        memo[len(memo)] = stack[-1] if stack else _ANY
        return
    elif nm in ("PUT", "BINPUT", "LONG_BINPUT"):
        memo[arg] = stack[-1] if stack else _ANY
        return
    elif nm in ("GET", "BINGET", "LONG_BINGET"):
        stack.append(memo.get(arg, _ANY))
        return
    elif nm in _STRING_OPS:
        s = arg if isinstance(arg, str) else (arg.decode("latin-1") if isinstance(arg, bytes) else str(arg))
        if s in _TELLTALE:
            info.strings.add(s)
        stack.append(s)
        return
    elif nm in _INT_OPS:
        stack.append(arg)
        return
    elif nm == "TUPLE":
        stack.append(tuple(_pop_to_mark(stack)))
        return
    elif nm in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(nm[-1])
        items = stack[-n:] if len(stack) >= n else [_ANY] * n
        del stack[-n:]
        stack.append(tuple(items))
        return
    elif nm in ("BINPERSID", "PERSID"):
        pid = stack.pop() if nm == "BINPERSID" and stack else arg
        if isinstance(pid, tuple) and pid and isinstance(pid[0], str):
            kinds[pid[0]] = None
        elif isinstance(pid, str):
            kinds[pid.split(" ")[0]] = None
        stack.append(_ANY)
        return
    # generic stack effect (pickletools' own description of each opcode)
    before, after = op.stack_before, op.stack_after
    if pickletools.markobject in before or (nm == "POP" and stack and stack[-1] is _MARK):
        _pop_to_mark(stack)
        try:
            n = before.index(pickletools.markobject)
        except ValueError:
            n = 0
    else:
        n = len(before)
    if n:
        del stack[-n:]
    for a in after:
        stack.append(_MARK if a is pickletools.markobject else _ANY)


def scan_pickles(f, count: int, name: str) -> tuple[list[PickleInfo], int]:
    """Scan ``count`` pickles stored back to back in file ``f`` (legacy torch format).

    Returns their infos and the offset where the data after them starts.
    """
    out, pos = [], 0
    for i in range(count):
        info, pos = scan_pickle(f, f"{name}#{i}")
        out.append(info)
    return out, pos
