"""What a DataLoader iterator says of its loader (the step clock's ``dataloader`` event and the
data-source instrument's ``data_loader`` event). The iterator's private attributes are read
through :mod:`torchdoctor.torch_internals`."""

from __future__ import annotations

from typing import Any


def loader_facts(it: Any) -> dict[str, Any]:
    """Workers, pinning, batch size, dataset, the user's ``__getitem__`` and the user's line
    that iterates it."""
    from torchdoctor.runner.frames import is_user_file, user_frame
    from torchdoctor.torch_internals import loader_iter_facts

    raw = loader_iter_facts(it)
    ds = raw["dataset"]
    code = getattr(getattr(type(ds), "__getitem__", None), "__code__", None)
    # a library dataset's own file says little: only a user's __getitem__ is named
    getitem = (f"{code.co_filename}:{code.co_firstlineno}"
               if code is not None and is_user_file(code.co_filename) else None)
    loop = user_frame(2)
    return {"num_workers": raw["num_workers"], "pin_memory": raw["pin_memory"],
            "prefetch_factor": raw["prefetch_factor"],
            "persistent_workers": raw["persistent_workers"], "batch_size": raw["batch_size"],
            "dataset": type(ds).__name__ if ds is not None else None, "getitem": getitem,
            "loop": f"{loop[0]}:{loop[1]}" if loop else None, "iterator": type(it).__name__}
