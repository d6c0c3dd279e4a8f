"""Which tensors the instruments may read, and a count of those they left alone.

The instruments read a tensor's storage (its address and size: memory accounting, saved-tensor
and allocation sites) or its values (fingerprints, finiteness). Tensors of other layouts have
no storage of their own or no values to read: sparse COO/CSR/CSC/BSR/BSC (``untyped_storage()``
raises "Cannot access storage of SparseTensorImpl"), nested tensors, meta tensors (no data),
quantized tensors (integer storage with a scale), and wrapper subclasses (DTensor, FakeTensor,
FunctionalTensor: their storage is not the data, or there is none). An instrument never touches
them: it skips each and counts it by kind (:class:`Skipped`), and says so in its evidence.
A hook that raised inside the user's forward broke the user's run (issue 27: gcn under
``memory``); skipping costs one attribute read or two per tensor.
"""

from __future__ import annotations

from typing import Any

# torch's packages whose tensor subclasses hold no data of their own (the class's module name is
# compared, nothing is imported): FakeTensor, FunctionalTensor, DTensor
_NO_DATA_MODULES = frozenset({"_subclasses", "distributed"})
MAX_KINDS = 16  # kinds counted (a bound on the evidence, not on the skipping)


def unsupported(t: Any) -> str | None:
    """None for a dense tensor with a storage of its own that may be read; else its kind
    (``sparse_coo``, ``sparse_csr``, ``nested``, ``meta``, ``quantized``, ``DTensor``, ...)."""
    try:
        layout = str(t.layout)
        if layout != "torch.strided":
            return layout.replace("torch.", "")
        cls = type(t)
        if getattr(cls, "__tensor_flatten__", None) is not None:  # DTensor and other wrappers
            return cls.__name__
        mod = (getattr(cls, "__module__", "") or "").split(".")
        if mod[0] == "torch" and mod[1:2] and mod[1] in _NO_DATA_MODULES:  # FakeTensor, functional
            return cls.__name__
        if t.is_nested:
            return "nested"
        if t.is_meta:
            return "meta"
        if t.is_quantized:
            return "quantized"
    except Exception:  # noqa: BLE001 - a tensor-like whose attributes raise is not read either
        return "unreadable"
    return None


class Skipped:
    """How many tensors of each unsupported kind an instrument left alone."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def check(self, t: Any) -> bool:
        """True when ``t`` may be read; else it is counted and False."""
        kind = unsupported(t)
        if kind is None:
            return True
        if kind in self.counts or len(self.counts) < MAX_KINDS:
            self.counts[kind] = self.counts.get(kind, 0) + 1
        return False

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def __bool__(self) -> bool:
        return bool(self.counts)
