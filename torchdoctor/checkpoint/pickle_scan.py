"""List what a pickle would import, from its opcodes alone (nothing is unpickled).

One pass over the opcodes (argument sizes and stack effects from ``pickletools``' opcode
table; ≈ 10× faster than ``pickletools.genops``, which matters for checkpoints with tens
of thousands of tensors) with a small stack simulation that keeps the values that matter
(strings, tuples, the memo), so that protocol-4 ``STACK_GLOBAL`` names are recovered too.
A name computed at run time (never a literal) is reported as ``<dynamic>``: refusing it
is the only safe reading.
"""

from __future__ import annotations

import contextlib
import pickletools
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING

from torchdoctor.checkpoint.allowlist import WEIGHTS_ONLY_OPS
from torchdoctor.checkpoint.values import PickleInfo

_MARK = object()
_ANY = object()
_TELLTALE = frozenset({"_modules", "_parameters", "_buffers"})


MAX_NAME = 300  # a global's name longer than this is cut (a crafted name can be megabytes)


class PickleScanError(ValueError):
    """The bytes are not a well-formed pickle (truncated, unknown opcode).

    ``partial`` is the :class:`PickleInfo` of what was read before the failure: its
    globals are judged like any others (``pickle.load`` imports and calls them before it
    reaches the broken opcode).
    """

    def __init__(self, message: str, partial: PickleInfo | None = None):
        super().__init__(message)
        self.partial = partial


# Every scan made inside ``collecting()`` is recorded (complete or partial), so that when a
# reader fails half-way, the audit still judges every pickle it saw.
_SINKS: list[list[PickleInfo]] = []


@contextlib.contextmanager
def collecting():
    sink: list[PickleInfo] = []
    _SINKS.append(sink)
    try:
        yield sink
    finally:
        _SINKS.remove(sink)


def _record(info: PickleInfo) -> None:
    for sink in _SINKS:
        sink.append(info)


def _cut(name: str) -> str:
    return name if len(name) <= MAX_NAME else name[:MAX_NAME] + f"…(+{len(name) - MAX_NAME} chars)"


def _fix_name(module: str, name: str, proto: int | None) -> str:
    if proto is None or proto < 3:
        if (module, name) in NAME_MAPPING:
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
    return f"{module}.{name}"


_MARKOBJ = pickletools.markobject
# opcode byte -> (name, argument size code, pops to mark, items popped, marks pushed per pushed item)
_TABLE: dict[int, tuple[str, int, bool, int, tuple[bool, ...]]] = {}
for _op in pickletools.opcodes:
    _before, _after = _op.stack_before, _op.stack_after
    _pm = _MARKOBJ in _before
    _TABLE[_op.code.encode("latin-1")[0]] = (
        _op.name, _op.arg.n if _op.arg is not None else 0, _pm,
        _before.index(_MARKOBJ) if _pm else len(_before), tuple(a is _MARKOBJ for a in _after))
_UNICODE_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"})
_BYTESTR_OPS = frozenset({"SHORT_BINSTRING", "BINSTRING"})
_MAX_STR = 4096  # longer string constants are not kept on the simulated stack
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def scan_pickle(data, name: str = "pickle", start: int = 0, record: bool = True,
                max_bytes: int | None = None) -> tuple[PickleInfo, int]:
    """Scan the pickle that starts at byte ``start`` of ``data`` (bytes or an mmap).

    Returns the :class:`PickleInfo` and the offset just after its STOP opcode (legacy
    torch files are several pickles back to back). Raises :class:`PickleScanError` carrying
    the partial info (globals seen before the failure). With ``record``, the info is also
    handed to every active :func:`collecting` sink. ``max_bytes`` bounds how far past
    ``start`` the scan may read (a pickle that runs on is refused, with what was seen).
    One pass over the opcodes; argument sizes come from ``pickletools``' opcode table.
    """
    info = PickleInfo(name=name)
    seen: dict[str, None] = {}
    unsupported: dict[str, None] = {}
    kinds: dict[str, None] = {}
    if record:
        _record(info)
    try:
        end = _scan(data, start, info, seen, unsupported, kinds, max_bytes)
    except Exception as e:  # noqa: BLE001 - any failure of a crafted stream is a scan error
        msg = str(e) if isinstance(e, PickleScanError) else f"{type(e).__name__} at opcode scan"
        info.error = msg
        _finish(info, seen, unsupported, kinds)
        raise PickleScanError(msg, info) from None
    _finish(info, seen, unsupported, kinds)
    return info, end


def _finish(info: PickleInfo, seen: dict, unsupported: dict, kinds: dict) -> None:
    info.globals = list(seen)
    info.unsupported_ops = list(unsupported)
    info.persistent_kinds = list(kinds)


def _scan(data, start: int, info: PickleInfo, seen: dict, unsupported: dict, kinds: dict,
          max_bytes: int | None) -> int:
    stack: list = []
    memo: dict = {}
    n = len(data) if max_bytes is None else min(len(data), start + max_bytes)
    i = start
    while True:
        if i >= n:
            if n < len(data):
                raise PickleScanError(f"pickle longer than the {max_bytes >> 20} MiB limit")
            raise PickleScanError("pickle ends without a STOP opcode (truncated?)")
        code = data[i]
        ent = _TABLE.get(code)
        if ent is None:
            raise PickleScanError(f"unknown opcode {code:#04x} at byte {i}")
        nm, argn, pops_mark, npop, after = ent
        i += 1
        arg = None
        if argn > 0:
            arg = data[i:i + argn]
            i += argn
        elif argn == -1:  # up to newline (GLOBAL/INST: two lines)
            j = data.find(b"\n", i, n)
            if j < 0:
                raise PickleScanError(f"{nm}: no newline (truncated?)")
            if nm in ("GLOBAL", "INST"):
                k = data.find(b"\n", j + 1, n)
                if k < 0:
                    raise PickleScanError(f"{nm}: no newline (truncated?)")
                arg = (bytes(data[i:j]), bytes(data[j + 1:k]))
                i = k + 1
            else:
                arg = bytes(data[i:j])
                i = j + 1
        elif argn < 0:
            width = 1 if argn == -2 else 8 if argn == -5 else 4
            if i + width > n:
                raise PickleScanError(f"{nm}: not enough data in stream (truncated?)")
            length = int.from_bytes(data[i:i + width], "little", signed=(argn == -3))
            if length < 0:
                raise PickleScanError(f"{nm}: negative length")
            i += width
            # only short strings can be names worth keeping: long ones are not copied (bounded memory)
            arg = data[i:i + length] if (nm in _UNICODE_OPS or nm in _BYTESTR_OPS) and length <= _MAX_STR \
                else None
            i += length
        if i > n:
            raise PickleScanError(f"{nm}: not enough data in stream (truncated?)")
        if nm not in WEIGHTS_ONLY_OPS:
            unsupported[nm] = None
        if nm == "STOP":
            break
        if nm == "PROTO":
            info.protocol = arg[0]
            continue
        if nm in ("GLOBAL", "INST"):
            seen[_cut(_fix_name(arg[0].decode("latin-1"), arg[1].decode("latin-1"), info.protocol))] = None
            if nm == "GLOBAL":
                stack.append(_ANY)
                continue
        elif nm == "STACK_GLOBAL":
            qual = stack.pop() if stack else _ANY
            module = stack.pop() if stack else _ANY
            seen[_cut(f"{module}.{qual}") if isinstance(module, str) and isinstance(qual, str) else "<dynamic>"] = None
            stack.append(_ANY)
            continue
        elif nm in _UNICODE_OPS or nm in _BYTESTR_OPS or nm in ("STRING", "UNICODE"):
            st = _decode_str(nm, arg) if arg is not None and len(arg) <= _MAX_STR else _ANY
            if st in _TELLTALE:
                info.strings.add(st)
            stack.append(st)
            continue
        elif nm == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else _ANY
            continue
        elif nm in _PUT_OPS:
            memo[_index(nm, arg)] = stack[-1] if stack else _ANY
            continue
        elif nm in _GET_OPS:
            stack.append(memo.get(_index(nm, arg), _ANY))
            continue
        elif nm.startswith("EXT"):
            seen[f"<copyreg extension {int.from_bytes(arg, 'little')}>"] = None
        elif nm == "TUPLE":
            stack.append(tuple(_pop_to_mark(stack)))
            continue
        elif nm in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(nm[-1])
            items = stack[-k:] if len(stack) >= k else [_ANY] * k
            del stack[-k:]
            stack.append(tuple(items))
            continue
        elif nm in ("BINPERSID", "PERSID"):
            pid = (stack.pop() if stack else _ANY) if nm == "BINPERSID" else arg.decode("latin-1")
            if isinstance(pid, tuple) and pid and isinstance(pid[0], str):
                kinds[pid[0]] = None
            elif isinstance(pid, str):
                kinds[pid.split(" ")[0]] = None
            stack.append(_ANY)
            continue
        # generic stack effect, from pickletools' description of the opcode
        if pops_mark or (nm == "POP" and stack and stack[-1] is _MARK):
            _pop_to_mark(stack)
        if npop:
            del stack[-npop:]
        for is_mark in after:
            stack.append(_MARK if is_mark else _ANY)
    return i


def _decode_str(nm: str, arg) -> str:
    raw = bytes(arg)
    if nm in _UNICODE_OPS:
        return raw.decode("utf-8", "surrogatepass")
    if nm == "UNICODE":
        return raw.decode("raw-unicode-escape")
    if nm == "STRING":  # a quoted repr, protocol 0
        return raw[1:-1].decode("latin-1") if len(raw) >= 2 and raw[:1] in (b"'", b'"') else raw.decode("latin-1")
    return raw.decode("latin-1")


def _index(nm: str, arg) -> int:
    if nm in ("GET", "PUT"):
        try:
            return int(arg)
        except ValueError:
            raise PickleScanError(f"{nm}: bad memo index {arg!r}") from None
    return int.from_bytes(arg, "little")


def _pop_to_mark(stack: list) -> list:
    items = []
    while stack:
        v = stack.pop()
        if v is _MARK:
            break
        items.append(v)
    items.reverse()
    return items
