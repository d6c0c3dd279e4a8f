"""Generic traversal of a read checkpoint tree (dicts, sequences, opaque objects, tensors)."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.checkpoint.values import NdArrayInfo, Opaque, TensorInfo, brief

MAX_DEPTH = 32


def children(obj: Any) -> Iterator[tuple[str, Any]]:
    """(key, child) pairs of a container; opaque objects expose their recorded state."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield _key(k), v
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield str(i), v
    elif isinstance(obj, Opaque):
        attrs = obj.attrs
        if attrs:
            for k, v in attrs.items():
                yield _key(k), v
        elif obj.state is not None:
            yield "<state>", obj.state
        for i, v in enumerate(obj.args):
            if not isinstance(v, type):
                yield f"<arg{i}>", v
        for k, v in obj.items.items():
            yield _key(k), v
        for i, v in enumerate(obj.list_items):
            yield str(i), v


def _key(k: Any) -> str:
    """A key as text: ints and other keys through ``brief`` (``str`` of a 5000-digit int raises)."""
    if isinstance(k, str):
        return k
    if isinstance(k, int) and not isinstance(k, bool):
        return brief(k)
    return brief(k, 80)


key_text = _key


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def iter_tensors(obj: Any, prefix: str = "", depth: int = 0, seen: set | None = None
                 ) -> Iterator[tuple[str, TensorInfo]]:
    """Every (dotted path, TensorInfo) under ``obj``; shared sub-objects (and tensors) are visited once.

    A tensor object reached by several paths (pickle memo: tied weights, or a crafted list of
    a million references) is yielded at its first path only, so every walk stays linear in the
    size of the file.
    """
    seen = set() if seen is None else seen
    if isinstance(obj, TensorInfo):
        if id(obj) not in seen:
            seen.add(id(obj))
            yield prefix, obj
        return
    if depth > MAX_DEPTH or id(obj) in seen or not _is_container(obj):
        return
    seen.add(id(obj))
    for k, v in children(obj):
        yield from iter_tensors(v, join(prefix, k), depth + 1, seen)


def _is_container(obj: Any) -> bool:
    return isinstance(obj, (dict, list, tuple, Opaque))


def iter_nodes(obj: Any, prefix: str = "", depth: int = 0, max_depth: int = 6, seen: set | None = None
               ) -> Iterator[tuple[str, Any, int]]:
    """Every (path, value, depth) down to ``max_depth`` (pre-order, containers included)."""
    seen = set() if seen is None else seen
    yield prefix, obj, depth
    if depth >= max_depth or not _is_container(obj) or id(obj) in seen:
        return
    seen.add(id(obj))
    for k, v in children(obj):
        yield from iter_nodes(v, join(prefix, k), depth + 1, max_depth, seen)


def kind_of(obj: Any) -> str:
    """A short type name for the contents tree."""
    if isinstance(obj, TensorInfo):
        return "tensor"
    if isinstance(obj, Opaque):
        return obj.cls
    if isinstance(obj, NdArrayInfo):
        return "numpy.ndarray"
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, int):
        return "int"
    if isinstance(obj, float):
        return "float"
    if isinstance(obj, str):
        return "str"
    if isinstance(obj, (bytes, bytearray)):
        return "bytes"
    if obj is None:
        return "None"
    return type(obj).__name__
