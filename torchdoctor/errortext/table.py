"""The error-text knowledge base: every known error and warning text of PyTorch, CUDA, NCCL, gloo,
the DataLoader, torch.compile and serialization, as one data table (exempt from the module-size
limit: it is data).

Read by ``ask`` (``triage/logscan.py`` scans a pasted error or log with the rows where ``ask`` is
true) and by the rules that judge a run's error text: the crash rule (``rules/crash.py``: a row's
``code`` is the finding a crash with that text raises; ``groups`` "crash-route" rows route a plain
``script-crashed`` to a skill, with ``hint`` as its first fix; "weights-only") and the cross-rank
rules (``distributed/failtext.py``: groups "collective-mismatch", "peer-gone",
"collective-timeout", "collective-transport"). The matcher and the number extractors are in
``match.py`` and ``numbers.py``: one API for both sides, so a text is recognised in one place.

Each row carries the skill it routes to, a one-line explanation and the first step. ``key`` is a
lower-case literal that every occurrence contains: a log is searched for the keys first (one C-level
scan each), and a row's regex runs only on lines that hold its key, so a 10,000-line log costs
milliseconds. Patterns are case-insensitive (a rule's row that must match case-sensitively says so
inside its pattern with ``(?-i:...)``). ``needle`` is the exact wording as written in ``source``:
``py:<file>`` (a file in the installed torch package), ``so:<library>`` (a string in torch's shared
library), or ``ext:<where>`` (CUDA or NCCL builds, the CUDA runtime or Python itself: not in the CPU
wheel); ``rule:`` for the rules' own broad rows. ``tests/test_ask_kb.py`` checks the ``py:`` needles
against the installed torch (and the ``so:`` ones, marked slow). Rows are tried in order; the first
match on a line wins.

Rows with ``ask=False`` are the rules' broad fallbacks (``\bout of memory\b``, ``NCCL``, ``Broken
pipe``): right for the message of an exception a script raised, too loose for pasted prose, which
``ask`` reads with its narrower rows only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torchdoctor.skills import (CHECKPOINTING as CKPT, CUSTOM_AUTOGRAD as AG, DEBUGGING as DBG,
                                DISTRIBUTED as DIST, MIXED_PRECISION as MP, MODULE_DESIGN as MOD,
                                PERFORMANCE as PERF, TENSOR_MEMORY as MEM)

OOM, INPLACE, DEVICE = "out-of-memory", "inplace-modified", "device-mismatch"  # finding codes
MISMATCH, HANG = "collective-mismatch", "collective-hang"


@dataclass(frozen=True)
class Known:
    id: str
    skill: str
    title: str
    key: str  # lower-case literal contained in every match
    pattern: str  # regex, case-insensitive, searched in the line (plus the next lines when it wraps)
    explain: str
    first: str  # the first step
    source: str  # py:<file in torch/> | so:<library> | ext:<where> | rule:<who reads it>
    needle: str  # exact wording as it appears in source
    sample: str  # a realistic occurrence (tests)
    severity: str = "error"  # "error" | "warning" (a warning is decisive only when nothing else is)
    numbers: str | None = None  # name of an extractor in ``numbers``
    wrapper: bool = False  # wraps or follows another error: that one is more decisive
    then: tuple[str, ...] = field(default=())  # skills to visit after this one
    generic: bool = False  # a heading: a more specific entry on the lines it wraps onto wins
    code: str | None = None  # the finding code a script's crash with this text raises (rules/crash.py)
    groups: tuple[str, ...] = ()  # named sets the rules read ("crash-route", "peer-gone", ...)
    ask: bool = True  # False: a rule's broad row, too loose for pasted prose (``ask`` skips it)
    hint: str = ""  # "crash-route": the crash finding's first fix

    def regex(self) -> re.Pattern:
        return _compiled(self.pattern)


_CACHE: dict[str, re.Pattern] = {}


def _compiled(p: str) -> re.Pattern:
    rx = _CACHE.get(p)
    if rx is None:
        rx = _CACHE[p] = re.compile(p, re.I)
    return rx


def K(id, skill, title, key, pattern, explain, first, source, needle, sample, **kw):  # noqa: N802
    return Known(id, skill, title, key, pattern, explain, first, source, needle, sample, **kw)


_PY_DL = "py:utils/data/dataloader.py"
_CUDA = "ext:CUDA runtime (cudaGetErrorString), CUDA builds"
_NCCL = "ext:torch/csrc/distributed/c10d/NCCLUtils.cpp, CUDA builds"

ASK_ROWS: tuple[Known, ...] = (
    # ---------------------------------------------------------------- memory
    K("cpu-alloc-failed", MEM, "host allocation failed (CPU out of memory)", "can't allocate memory",
      r"DefaultCPUAllocator: can't allocate memory: you tried to allocate \d+ bytes",
      "A CPU tensor allocation failed: the host ran out of RAM (or the size is absurd, e.g. a shape bug).",
      "Check the requested size below against the host's RAM; if it is far too large, look for a shape "
      "bug; otherwise run `torchdoctor memory SCRIPT` for the peak breakdown.",
      "so:libc10.so", "DefaultCPUAllocator: can't allocate memory: you tried to allocate ",
      "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
      "you tried to allocate 274877906944 bytes. Error code 12 (Cannot allocate memory)",
      numbers="cpu_alloc", code=OOM),
    K("mps-oom", MEM, "MPS (Apple GPU) out of memory", "mps backend out of memory", r"MPS backend out of memory",
      "The Apple-GPU allocator hit its limit.",
      "Run `torchdoctor memory SCRIPT` for the peak breakdown; PYTORCH_MPS_HIGH_WATERMARK_RATIO raises the "
      "cap at your own risk.",
      "ext:aten/src/ATen/mps/MPSAllocator.mm, macOS builds", "MPS backend out of memory",
      "RuntimeError: MPS backend out of memory (MPS allocated: 17.01 GB, other allocations: 1.09 GB, max "
      "allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.", numbers="oom", code=OOM),
    K("cuda-oom", MEM, "CUDA out of memory", "cuda out of memory",
      r"CUDA out of memory(?:\.\s*Tried to allocate [\d.]{1,40}\s*\w{1,100})?",
      "An allocation on the GPU failed: what PyTorch holds plus the request exceed what is free on the "
      "device.",
      "Run `torchdoctor memory SCRIPT` for the peak breakdown (parameters, gradients, optimizer state, "
      "activations); compare the numbers below first.",
      "ext:c10/cuda/CUDACachingAllocator.cpp, CUDA builds", "CUDA out of memory. Tried to allocate ",
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
      "of 79.11 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.59 GiB "
      "memory in use. Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.10 GiB is reserved "
      "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.", numbers="oom", code=OOM),
    K("cuda-runtime-oom", MEM, "CUDA runtime out of memory", "cuda error: out of memory",
      r"CUDA error: out of memory",
      "A CUDA allocation outside PyTorch's caching allocator failed (context creation, cuBLAS/cuDNN "
      "workspaces, NCCL buffers, another process filling the GPU).",
      "Check what else holds the GPU (`nvidia-smi`, `torchdoctor env`); then `torchdoctor memory SCRIPT`.",
      _CUDA, "out of memory", "RuntimeError: CUDA error: out of memory", code=OOM),
    K("cublas-alloc", MEM, "cuBLAS could not allocate its workspace", "cublas_status_alloc_failed",
      r"CUBLAS_STATUS_ALLOC_FAILED",
      "cuBLAS failed to allocate: the GPU is (nearly) full when a matmul starts; it is an OOM in disguise.",
      "Treat it as CUDA OOM: `torchdoctor memory SCRIPT`.",
      "ext:aten/src/ATen/cuda/CublasHandlePool.cpp, CUDA builds", "CUBLAS_STATUS_ALLOC_FAILED",
      "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", code=OOM),
    K("dl-worker-killed", MEM, "DataLoader worker killed by a signal", "is killed by signal",
      r"DataLoader worker \(pid \d+\) is killed by signal: ?(?P<signal>[\w ]{1,100})",
      "A DataLoader worker process died from a signal; 'Killed' (SIGKILL) is usually the host's OOM killer.",
      "Watch host RAM while it runs (each worker copies Python objects of the dataset); lower "
      "num_workers, keep dataset metadata in numpy arrays rather than Python lists, then "
      "`torchdoctor memory SCRIPT`.",
      "so:libtorch_python.so", "is killed by signal: ",
      "RuntimeError: DataLoader worker (pid 12345) is killed by signal: Killed.", numbers="pid_signal"),
    K("dl-shm", MEM, "DataLoader worker ran out of shared memory", "insufficient shared memory",
      r"insufficient shared memory \(shm\)",
      "Workers pass batches through /dev/shm, which is too small (typical in Docker: 64 MB).",
      "Give the container more shared memory (`docker run --shm-size=8g` or `--ipc=host`), or lower "
      "num_workers / batch size.",
      "so:libtorch_python.so", "insufficient shared memory (shm)",
      "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
      "memory (shm)."),
    K("dl-worker-exited", MEM, "DataLoader worker exited unexpectedly", "exited unexpectedly",
      r"DataLoader worker \(pid(?:\(s\))? [\d, ]{1,300}\) exited unexpectedly",
      "A worker process died without a Python error: usually killed for memory (host RAM or /dev/shm) "
      "or a crash in native code.",
      "Re-run with num_workers=0 to see the real error; check host RAM and /dev/shm while it runs.",
      _PY_DL, "exited unexpectedly",
      "RuntimeError: DataLoader worker (pid(s) 4021, 4022) exited unexpectedly"),
    K("view-stride", MEM, "view() on a non-contiguous tensor", "view size is not compatible",
      r"view size is not compatible with input tensor's size and stride",
      "`.view` needs memory laid out contiguously; after transpose/permute it is not.",
      "Use `.reshape(...)` (copies only when needed) or `.contiguous().view(...)`.",
      "so:libtorch_cpu.so", "view size is not compatible with input tensor's size and stride",
      "RuntimeError: view size is not compatible with input tensor's size and stride (at least one "
      "dimension spans across two contiguous subspaces). Use .reshape(...) instead."),
    K("broadcast-size", MEM, "shapes do not broadcast", "must match the size of tensor b",
      r"The size of tensor a \((?P<a>\d+)\) must match the size of tensor b \((?P<b>\d+)\) at "
      r"non-singleton dimension (?P<dim>\d+)",
      "An elementwise op got tensors whose shapes differ in a dimension where neither is 1.",
      "Print both shapes just before the failing line (from the traceback); usually a missing "
      "unsqueeze/transpose or a wrong batch/sequence length.",
      "so:libtorch_cpu.so", ") must match the size of tensor b (",
      "RuntimeError: The size of tensor a (32) must match the size of tensor b (64) at non-singleton "
      "dimension 1", numbers="groups"),
    K("reshape-size", MEM, "reshape to an impossible shape", "is invalid for input of size",
      r"shape '\[(?P<shape>[^\]\n]{0,300})\]' is invalid for input of size (?P<numel>\d+)",
      "The target shape's element count differs from the tensor's.",
      "Compute the expected numel from the shape; use -1 for the inferred dimension; check the batch size "
      "of the last, smaller batch (drop_last).",
      "so:libtorch_cpu.so", "' is invalid for input of size ",
      "RuntimeError: shape '[4, 48, 4, 64]' is invalid for input of size 40960", numbers="groups"),
    K("index-oob-dim", MEM, "index out of bounds for a dimension", "is out of bounds for dimension",
      r"index (?P<index>-?\d+) is out of bounds for dimension (?P<dim>\d+) with size (?P<size>\d+)",
      "Indexing went past the end of a dimension.",
      "Print the index and the tensor's shape at the failing line; check off-by-one and the last batch.",
      "so:libtorch_cpu.so", " is out of bounds for dimension ",
      "IndexError: index 5 is out of bounds for dimension 0 with size 3", numbers="groups"),
    K("stack-size", MEM, "batch items of different sizes", "stack expects each tensor to be equal size",
      r"stack expects each tensor to be equal size",
      "default_collate stacks samples; samples of different shapes (images, sequences) cannot stack.",
      "Resize/crop to one size in the transform, or pad in a custom `collate_fn`.",
      "py:_refs/__init__.py", "stack expects each tensor to be equal size, but got ",
      "RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and "
      "[3, 256, 256] at entry 1"),
    K("cat-size", MEM, "concatenation of mismatched shapes", "sizes of tensors must match except in dimension",
      r"Sizes of tensors must match except in dimension",
      "torch.cat/stack got tensors that differ outside the concatenation dimension.",
      "Print the shapes of the list just before the call; pad or crop to agree.",
      "so:libtorch_cpu.so", "Sizes of tensors must match except in dimension ",
      "RuntimeError: Sizes of tensors must match except in dimension 1. Expected size 3 but got size 4 "
      "for tensor number 1 in the list."),
    K("numpy-requires-grad", MEM, "numpy() on a tensor that requires grad",
      "can't call numpy() on tensor that requires grad",
      r"Can't call numpy\(\) on Tensor that requires grad",
      "Converting to numpy would silently leave the autograd graph.",
      "Use `t.detach().cpu().numpy()`; for logging a scalar, `loss.item()`.",
      "so:libtorch_python.so", "Can't call numpy() on Tensor that requires grad",
      "RuntimeError: Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."),
    K("numpy-cuda", MEM, "numpy() on a CUDA tensor", "device type tensor to numpy",
      r"can't convert \S{1,300} device type tensor to numpy",
      "numpy arrays live in host memory; a CUDA tensor must be copied first.",
      "Use `t.detach().cpu().numpy()` (once, outside the hot loop: it syncs the GPU).",
      "so:libtorch_python.so", " device type tensor to numpy. Use Tensor.cpu() to ",
      "TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to "
      "host memory first."),
    K("numpy-not-writable", MEM, "tensor from a read-only numpy array", "numpy array is not writable",
      r"The given NumPy array is not writable",
      "torch.from_numpy shares memory with an array numpy marked read-only.",
      "Copy it first (`np.array(x)` or `x.copy()`), or ignore if you never write to the tensor.",
      "so:libtorch_python.so", "The given NumPy array is not writable",
      "UserWarning: The given NumPy array is not writable, and PyTorch does not support non-writable "
      "tensors.", severity="warning"),
    K("negative-dim", MEM, "tensor with a negative dimension", "create tensor with negative dimension",
      r"Trying to create tensor with negative dimension",
      "A size computed at run time went negative (e.g. a sequence shorter than a kernel or window).",
      "Print the computed sizes; check input lengths against kernel/pool/window sizes.",
      "so:libtorch_cpu.so", "Trying to create tensor with negative dimension ",
      "RuntimeError: Trying to create tensor with negative dimension -1: [-1, 128]"),
    K("bool-ambiguous", MEM, "Python truth value of a multi-element tensor", "is ambiguous",
      r"Boolean value of Tensor with more than one value is ambiguous",
      "`if t:` / `and` / `or` on a tensor with several elements.",
      "Use `.any()` / `.all()` or compare element-wise; keep Python control flow on scalars.",
      "so:libtorch_cpu.so", "Boolean value of Tensor with more than one value is ambiguous",
      "RuntimeError: Boolean value of Tensor with more than one value is ambiguous"),
    K("item-multi", MEM, "item() on a multi-element tensor", "elements cannot be converted to scalar",
      r"a Tensor with (?P<elements>\d+) elements cannot be converted to Scalar",
      "`.item()`/`float()` needs exactly one element (often an unreduced loss).",
      "Reduce first (`loss.mean()`), or check the loss's `reduction`.",
      "so:libtorch_cpu.so", " elements cannot be converted to Scalar",
      "RuntimeError: a Tensor with 3 elements cannot be converted to Scalar", numbers="groups"),
    K("item-multi-legacy", MEM, "item() on a multi-element tensor (Python scalar)",
      "only one element tensors can be converted",
      r"only one element tensors can be converted to Python scalars",
      "`float(t)`/`int(t)` needs exactly one element (often an unreduced loss).",
      "Reduce first (`loss.mean()`), or check the loss's `reduction`.",
      "so:libtorch_cpu.so", "only one element tensors can be converted to Python scalars",
      "ValueError: only one element tensors can be converted to Python scalars"),
    # ---------------------------------------------------------------- module design
    K("device-mismatch", MOD, "tensors on different devices", "expected all tensors to be on the same device",
      r"Expected all tensors to be on the same device",
      "An op mixed tensors on different devices: a model part, a buffer or an input was not moved.",
      "Move the model once with `.to(device)` before building the optimizer; register constant tensors "
      "with `register_buffer` so they move with it; move each batch; `torchdoctor checkup SCRIPT` names "
      "the tensor.",
      "so:libtorch_cpu.so", "Expected all tensors to be on the same device, but ",
      "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
      "and cpu!", numbers="devices", code=DEVICE),
    K("input-weight-type", MOD, "input and weight differ in device or dtype", "should be the same",
      r"Input type \((?P<input>[^)\n]{1,300})\) and (?:weight|bias) type \((?P<weight>[^)\n]{1,300})\) should be the same",
      "A layer's input and its weights differ in device (cuda vs cpu tensor types) or dtype.",
      "Move the input to the model's device/dtype (`x.to(next(model.parameters()))`), or the model to the "
      "input's; under mixed precision let autocast cast instead of `.half()` by hand.",
      "so:libtorch_cpu.so", ") should be the same",
      "RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the "
      "same", numbers="groups"),
    K("dtype-mismatch", MOD, "mixed dtypes in one op", "expected scalar type",
      r"expected scalar type (?P<expected>\w{1,100}) but found (?P<found>\w{1,100})",
      "An op got tensors of different dtypes (e.g. float64 numpy data into a float32 model, Long "
      "targets where Float is needed).",
      "Cast the data once in the Dataset/collate (`torch.from_numpy(x).float()`); for losses check the "
      "target dtype it expects.",
      "so:libtorch_cpu.so", "expected scalar type ",
      "RuntimeError: expected scalar type Float but found Double", numbers="groups"),
    K("matmul-dtype", MOD, "matmul inputs of different dtypes", "must have the same dtype, but got",
      r"(?:mat1 and mat2|self and mat2|\b\w{1,100} input tensors) must have the same dtype, but got (?P<a>\w{1,100}) and "
      r"(?P<b>\w{1,100})",
      "A matmul/Linear got float64 data with float32 weights (numpy's default dtype), or fp16 against fp32 "
      "outside autocast.",
      "Cast the data once in the Dataset/collate (`.float()`); for half precision use `torch.autocast` "
      "rather than casting by hand.",
      "so:libtorch_cpu.so", "mat1 and mat2 must have the same dtype, but got ",
      "RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Float", numbers="groups"),
    K("mm-dtype", MOD, "mm inputs of different dtypes", "to have the same dtype, but got:",
      r"expected m1 and m2 to have the same dtype, but got: (?P<a>[\w:]{1,100}) != (?P<b>[\w:]{1,100})",
      "A matrix product mixes dtypes (float64 numpy data, or Half against Float outside autocast).",
      "Cast the data once (`.float()`); for half precision use `torch.autocast`.",
      "so:libtorch_cpu.so", "expected m1 and m2 to have the same dtype, but got: ",
      "RuntimeError: expected m1 and m2 to have the same dtype, but got: float != double", numbers="groups"),
    K("rnn-dtype", MOD, "RNN input dtype differs from its weights", "does not match weight dtype",
      r"RNN input dtype \((?P<input>[\w.]{1,300})\) does not match weight dtype \((?P<weight>[\w.]{1,300})\)",
      "The RNN's input and weights have different dtypes (often float64 from numpy).",
      "Convert the input once (`x.float()`), or the model, as the message says.",
      "py:nn/modules/rnn.py", "does not match weight dtype (",
      "ValueError: RNN input dtype (torch.float64) does not match weight dtype (torch.float32). Convert "
      "input: input.to(torch.float32), or convert model: model.to(torch.float64)", numbers="groups"),
    K("matmul-shapes", MOD, "Linear/matmul shapes do not fit", "mat1 and mat2 shapes cannot be multiplied",
      r"mat1 and mat2 shapes cannot be multiplied \((?P<m1>\d+x\d+) and (?P<m2>\d+x\d+)\)",
      "The input's last dimension differs from the Linear layer's in_features (a flatten or a layer size "
      "is wrong).",
      "Compare the input's feature size with the layer's in_features in the numbers below; fix the "
      "flatten or the layer size, or use `nn.LazyLinear`.",
      "so:libtorch_cpu.so", "mat1 and mat2 shapes cannot be multiplied (",
      "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x2048 and 512x10)", numbers="groups"),
    K("conv-channels", MOD, "conv input has the wrong channel count", "channels, but got",
      r"expected input\[(?P<input>[^\]\n]{1,300})\] to have (?P<expected>\d+) channels, but got (?P<got>\d+) "
      r"channels instead",
      "The conv layer expects a different channel count (e.g. grayscale into an RGB model, or NHWC "
      "layout).",
      "Check the channel dimension of the batch (N, C, H, W); convert grayscale to 3 channels or change "
      "in_channels; permute NHWC to NCHW.",
      "so:libtorch_cpu.so", "Given groups=",
      "RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[8, 1, 224, 224] to have "
      "3 channels, but got 1 channels instead", numbers="groups"),
    K("conv-ndim", MOD, "conv input has the wrong number of dimensions", "(unbatched) or",
      r"Expected \d+D \(unbatched\) or \d+D \(batched\) input to \w{1,100}",
      "The layer got a tensor without (or with an extra) batch or channel dimension.",
      "Check the input's shape: add the batch dimension with `unsqueeze(0)`, or fix the dataset's output "
      "shape.",
      "so:libtorch_cpu.so", "D (unbatched) or ",
      "RuntimeError: Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: "
      "[64, 784]"),
    K("bn-single", MOD, "BatchNorm with one value per channel", "expected more than 1 value per channel",
      r"Expected more than 1 value per channel when training",
      "BatchNorm in training mode cannot normalise a batch of one (often the last, smaller batch).",
      "Use `drop_last=True`, a larger batch, `model.eval()` for single-sample inference, or GroupNorm/"
      "LayerNorm.",
      "py:nn/functional.py", "Expected more than 1 value per channel when training, got input size ",
      "ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 64])"),
    K("module-before-init", MOD, "submodule assigned before super().__init__()",
      "cannot assign module before module.__init__() call",
      r"cannot assign module before Module\.__init__\(\) call",
      "A module attribute was set before `super().__init__()` ran.",
      "Call `super().__init__()` first in your module's `__init__`.",
      "py:nn/modules/module.py", "cannot assign module before Module.__init__() call",
      "AttributeError: cannot assign module before Module.__init__() call"),
    K("param-assign", MOD, "plain tensor assigned to a Parameter attribute", "(torch.nn.parameter or none expected)",
      r"cannot assign '[^'\n]{1,300}' as parameter '[^'\n]{1,300}' \(torch\.nn\.Parameter or None expected\)",
      "An attribute registered as a Parameter was overwritten with a plain tensor.",
      "Wrap it: `self.w = nn.Parameter(t)`, or update in place under `torch.no_grad()` "
      "(`self.w.copy_(t)`).",
      "py:nn/modules/module.py", "(torch.nn.Parameter or None expected)",
      "TypeError: cannot assign 'torch.FloatTensor' as parameter 'weight' (torch.nn.Parameter or None "
      "expected)"),
    K("empty-params", MOD, "optimizer built with no parameters", "optimizer got an empty parameter list",
      r"optimizer got an empty parameter list",
      "`model.parameters()` was empty: layers kept in a plain list/dict are not registered, or the "
      "generator was already consumed.",
      "Use `nn.ModuleList`/`nn.ModuleDict`; pass `list(model.parameters())` once; "
      "`torchdoctor checkup SCRIPT` reports unregistered submodules.",
      "py:optim/optimizer.py", "optimizer got an empty parameter list",
      "ValueError: optimizer got an empty parameter list"),
    K("rnn-input-size", MOD, "RNN input size differs from the layer's", "must be equal to input_size",
      r"input\.size\(-1\) must be equal to input_size\. Expected (?P<expected>\d+), got (?P<got>\d+)",
      "The RNN/LSTM's input_size does not match the last dimension of its input.",
      "Check `batch_first` and the embedding size feeding the RNN.",
      "so:libtorch_cpu.so", "input.size(-1) must be equal to input_size. Expected ",
      "RuntimeError: input.size(-1) must be equal to input_size. Expected 128, got 64", numbers="groups"),
    # ---------------------------------------------------------------- debugging
    K("inplace-modified", DBG, "a tensor needed by backward was modified in place",
      "has been modified by an inplace operation",
      r"modified by an inplace operation: \[(?P<tensor>[\w.]{1,300} \[[^\]\n]{0,300}\])\](?:, which is output \d+ of (?P<op>\w{1,100}))?"
      r"(?:, is at version (?P<version>\d+); expected version (?P<expected_version>\d+))?",
      "Backward needs a value that an in-place op (`+=`, `relu_`, `x[...] = `, inplace=True) overwrote.",
      "Replay one step with `torch.autograd.set_detect_anomaly(True)` to get the forward line; replace "
      "the in-place op there with its out-of-place form.",
      "so:libtorch_cpu.so", "one of the variables needed for gradient computation has been modified by an "
      "inplace operation: [",
      "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
      "operation: [torch.FloatTensor [256, 512]], which is output 0 of ReluBackward0, is at version 1; "
      "expected version 0 instead. Hint: enable anomaly detection to find the operation that failed to "
      "compute its gradient, with torch.autograd.set_detect_anomaly(True).", numbers="groups",
      then=(AG,), code=INPLACE),
    K("backward-twice", DBG, "backward through a freed graph", "backward through the graph a second time",
      r"Trying to backward through the graph a second time",
      "A graph from an earlier step is reused: a tensor (RNN hidden state, a running total, a cached "
      "output) carries history across steps.",
      "Detach what crosses steps (`h = h.detach()`, `total += loss.item()`); `retain_graph=True` only "
      "when you really backprop twice.",
      "so:libtorch_cpu.so", "Trying to backward through the graph a second time",
      "RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors "
      "after they have already been freed)."),
    K("no-grad-fn", DBG, "backward on a tensor with no graph", "does not require grad and does not have a grad_fn",
      r"element \d+ of tensors does not require grad and does not have a grad_fn",
      "The loss is not connected to any parameter: computed under `torch.no_grad()`, from detached "
      "values, or every parameter is frozen.",
      "Check for `no_grad`/`inference_mode`/`.detach()`/`.item()` between the model output and the loss, "
      "and that some parameters have `requires_grad=True`.",
      "so:libtorch_cpu.so", " of tensors does not require grad and does not have a grad_fn",
      "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"),
    K("scalar-outputs", DBG, "backward on a non-scalar", "grad can be implicitly created only for scalar outputs",
      r"grad can be implicitly created only for scalar outputs",
      "`.backward()` without an argument needs a scalar; the loss was not reduced.",
      "Reduce the loss (`.mean()`/`.sum()`) or check the criterion's `reduction`.",
      "so:libtorch_cpu.so", "grad can be implicitly created only for scalar outputs",
      "RuntimeError: grad can be implicitly created only for scalar outputs"),
    K("leaf-inplace", DBG, "in-place op on a leaf that requires grad", "leaf variable that requires grad",
      r"a (?:view of a )?leaf Variable that requires grad (?:is being|has been) used in an in-place operation",
      "A parameter (leaf) was modified in place while autograd tracks it.",
      "Do manual updates under `with torch.no_grad():`, or use an out-of-place op.",
      "so:libtorch_cpu.so", "a leaf Variable that requires grad is being used in an in-place operation.",
      "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation."),
    K("anomaly-nan", DBG, "anomaly mode: a backward function produced NaN", "returned nan values in its",
      r"Function '(?P<function>\w{1,100})' returned nan values in its (?P<output>\d+)\w{0,4} output",
      "Anomaly detection caught the first backward node whose gradient is NaN.",
      "Read the 'Traceback of forward call' printed just before: that forward line is the op to make "
      "safe (eps, clamp, log_softmax); `torchdoctor nan SCRIPT` names the module.",
      "so:libtorch_cpu.so", "' returned nan values in its ",
      "RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.", numbers="groups"),
    K("anomaly-forward", DBG, "anomaly mode: forward trace of the failing node", "error detected in",
      r"Error detected in (?P<function>\w{1,100})\. Traceback of forward call",
      "Anomaly detection printed the forward line whose backward failed.",
      "Look at the last frame of that traceback in your code: make that op numerically safe.",
      "so:libtorch_cpu.so", "Error detected in ",
      "UserWarning: Error detected in LogBackward0. Traceback of forward call that caused the error:",
      severity="warning", numbers="groups"),
    K("anomaly-enabled", DBG, "anomaly detection is on", "anomaly detection has been enabled",
      r"Anomaly Detection has been enabled",
      "Anomaly mode slows every step (about 2.5x); meant for short debugging runs only.",
      "Turn it off once the failing op is found.",
      "py:autograd/anomaly_mode.py", "Anomaly Detection has been enabled. ",
      "UserWarning: Anomaly Detection has been enabled. This mode will increase the runtime and should "
      "only be enabled for debugging.", severity="warning"),
    K("nonfinite-clip", DBG, "gradient norm is NaN/Inf at clipping", "is non-finite, so it cannot be clipped",
      r"is non-finite, so it cannot be clipped",
      "clip_grad_norm_(error_if_nonfinite=True) found NaN/Inf gradients.",
      "Find where they start: `torchdoctor nan SCRIPT` (first non-finite gradient, module, step).",
      "py:nn/utils/clip_grad.py", "`parameters` is non-finite, so it cannot be clipped. To disable ",
      "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it "
      "cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, "
      "set `error_if_nonfinite=False`"),
    K("device-assert", DBG, "CUDA device-side assert", "device-side assert triggered",
      r"device-side assert triggered",
      "A kernel's bounds check failed, most often a class index >= num_classes or an embedding index >= "
      "vocabulary size. The Python line shown may be wrong: CUDA errors are reported asynchronously.",
      "Re-run with `CUDA_LAUNCH_BLOCKING=1` (or the same batch on CPU) for the exact line; check label "
      "and index ranges.",
      _CUDA, "device-side assert triggered",
      "RuntimeError: CUDA error: device-side assert triggered"),
    K("cuda-assert-target", DBG, "label outside [0, n_classes) on CUDA", "t >= 0 && t < n_classes",
      r"Assertion `t >= 0 && t < n_classes` failed",
      "A target class index is negative or >= the number of classes.",
      "Check `labels.min()`/`labels.max()` against the model's output size (ignore_index for padding).",
      "ext:aten/src/ATen/native/cuda/Loss.cu, CUDA builds", "Assertion `t >= 0 && t < n_classes` failed",
      "/pytorch/aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: "
      "[0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed."),
    K("cuda-assert-index", DBG, "index out of range on CUDA", "srcindex < srcselectdimsize",
      r"Assertion `srcIndex < srcSelectDimSize` failed",
      "An index (typically a token id into nn.Embedding) is >= the table size.",
      "Check `ids.max()` against `num_embeddings` (tokenizer vs model vocabulary size).",
      "ext:aten/src/ATen/native/cuda/Indexing.cu, CUDA builds", "Assertion `srcIndex < srcSelectDimSize` failed",
      "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [16,0,0], "
      "thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed."),
    K("illegal-address", DBG, "illegal memory access on the GPU", "an illegal memory access was encountered",
      r"an illegal memory access was encountered",
      "A kernel read or wrote outside its memory: a bad index, a custom kernel bug, or a driver issue.",
      "Re-run with `CUDA_LAUNCH_BLOCKING=1` for the failing op; try the same step on CPU to get a Python "
      "error; suspect custom CUDA/Triton kernels first.",
      _CUDA, "an illegal memory access was encountered",
      "RuntimeError: CUDA error: an illegal memory access was encountered"),
    K("index-oob", DBG, "index out of range (embedding or gather)", "index out of range in self",
      r"index out of range in self",
      "An index is >= the size of the dimension it indexes (usually a token id >= the embedding size).",
      "Check `ids.max()` against `num_embeddings` / the indexed dimension.",
      "so:libtorch_cpu.so", "index out of range in self",
      "IndexError: index out of range in self"),
    K("target-oob", DBG, "class label out of range", "is out of bounds",
      r"Target (?P<target>-?\d+) is out of bounds",
      "A target class index is negative or >= the number of classes (model output size).",
      "Check `labels.min()`/`labels.max()` against the output size; set `ignore_index` for padding labels.",
      "so:libtorch_cpu.so", " is out of bounds.",
      "IndexError: Target 10 is out of bounds.", numbers="groups"),
    K("batch-size-mismatch", DBG, "input and target batch sizes differ", "expected input batch_size",
      r"Expected input batch_size \((?P<input>\d+)\) to match target batch_size \((?P<target>\d+)\)",
      "The loss got outputs and targets with different first dimensions, usually a view/flatten that "
      "folded the sequence or batch dimension.",
      "Print output and target shapes at the loss; for sequence models flatten both consistently.",
      "so:libtorch_cpu.so", "Expected input batch_size (",
      "ValueError: Expected input batch_size (32) to match target batch_size (64).", numbers="groups"),
    K("target-size-broadcast", DBG, "loss input and target shapes differ (broadcast)", "using a target size",
      r"Using a target size \((?P<target>[^)\n]{0,300}\)?)\) that is different to the input size",
      "The loss broadcasts [B] against [B, 1] into [B, B]: the value is silently wrong.",
      "Make both shapes equal (`out.squeeze(-1)` or `target.unsqueeze(-1)`).",
      "py:nn/functional.py", "Using a target size (",
      "UserWarning: Using a target size (torch.Size([32])) that is different to the input size "
      "(torch.Size([32, 1])). This will likely lead to incorrect results due to broadcasting. Please "
      "ensure they have the same size.", severity="warning"),
    K("multi-target", DBG, "class-index loss got a 2-D target", "multi-target not supported",
      r"multi-target not supported",
      "CrossEntropyLoss/NLLLoss with class indices wants a 1-D target (one-hot or [B, 1] given).",
      "Pass `target.argmax(1)` or `target.squeeze(1)` (or float class probabilities of the output's shape).",
      "so:libtorch_cpu.so", "0D or 1D target tensor expected, multi-target not supported",
      "RuntimeError: 0D or 1D target tensor expected, multi-target not supported"),
    K("target-float", DBG, "class-probability target has an integer dtype", "expected floating point type for target",
      r"Expected floating point type for target with class probabilities",
      "A target with the output's shape is read as probabilities and must be float.",
      "Pass class indices as a 1-D Long tensor, or probabilities as float.",
      "so:libtorch_cpu.so", "Expected floating point type for target with class probabilities, got ",
      "RuntimeError: Expected floating point type for target with class probabilities, got Long"),
    K("dl-worker-caught", DBG, "exception inside a DataLoader worker", "in dataloader worker process",
      r"Caught (?P<exception>\w{1,100}) in DataLoader worker process (?P<worker>\d+)",
      "Your Dataset or collate_fn raised inside a worker; the real traceback follows 'Original Traceback'.",
      "Read the Original Traceback below it (your `__getitem__`); num_workers=0 reproduces it in the main "
      "process.",
      "py:utils/data/_utils/worker.py", "in DataLoader worker process ",
      "ValueError: Caught ValueError in DataLoader worker process 0.", wrapper=True, numbers="groups"),
    K("collate-type", DBG, "Dataset returned a type default_collate cannot batch", "batch must contain tensors",
      r"default_collate: batch must contain tensors",
      "`__getitem__` returned something not batchable (a PIL image, None, a custom object).",
      "Return tensors (add `transforms.ToTensor()`), filter out None samples, or write a `collate_fn`.",
      "py:utils/data/_utils/collate.py", "default_collate: batch must contain tensors, numpy arrays, numbers, ",
      "TypeError: default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
      "<class 'PIL.Image.Image'>"),
    K("nonleaf-grad", DBG, ".grad read on a non-leaf tensor", "that is not a leaf tensor is being accessed",
      r"\.grad attribute of a Tensor that is not a leaf Tensor is being accessed",
      "Only leaves (parameters, inputs with requires_grad) get `.grad`; this read returns None.",
      "Read `.grad` on the parameter itself, or call `.retain_grad()` on the intermediate before backward.",
      "so:libtorch_python.so", "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed.",
      "UserWarning: The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
      "attribute won't be populated during autograd.backward().", severity="warning"),
    K("inference-saved", DBG, "inference-mode tensor used in autograd",
      "inference tensors cannot be saved for backward",
      r"Inference tensors cannot be saved for backward",
      "A tensor created under `torch.inference_mode()` flowed into a computation being trained.",
      "Create it under `torch.no_grad()` instead, or `.clone()` it outside inference mode.",
      "so:libtorch_cpu.so", "Inference tensors cannot be saved for backward.",
      "RuntimeError: Inference tensors cannot be saved for backward. To work around you can make a clone "
      "to get a normal tensor and use it in autograd."),
    K("inference-inplace", DBG, "in-place update of an inference tensor", "inplace update to inference tensor",
      r"Inplace update to inference tensor outside InferenceMode",
      "A tensor made under `torch.inference_mode()` is modified in place outside it.",
      "Clone it first, or use `torch.no_grad()` where the tensor is created.",
      "so:libtorch_cpu.so", "Inplace update to inference tensor outside InferenceMode is not allowed.",
      "RuntimeError: Inplace update to inference tensor outside InferenceMode is not allowed.You can make a "
      "clone to get a normal tensor before doing inplace update."),
    K("no-driver", DBG, "no NVIDIA driver", "found no nvidia driver",
      r"Found no NVIDIA driver on your system",
      "This torch build wants CUDA but the machine (or container) has no working NVIDIA driver.",
      "Run `torchdoctor env` to see the torch build, CUDA version and visible GPUs; in Docker use "
      "`--gpus all`.",
      "ext:c10/cuda/CUDAFunctions.cpp, CUDA builds", "Found no NVIDIA driver on your system",
      "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
      "installed a driver from http://www.nvidia.com/Download/index.aspx"),
    K("no-cuda-build", DBG, "CPU-only torch asked for CUDA", "torch not compiled with cuda enabled",
      r"Torch not compiled with CUDA enabled",
      "The installed torch wheel is the CPU build.",
      "Run `torchdoctor env` (torch build, CUDA version); install a CUDA wheel matching the driver.",
      "py:cuda/__init__.py", "Torch not compiled with CUDA enabled",
      "AssertionError: Torch not compiled with CUDA enabled"),
    K("no-kernel-image", DBG, "torch build does not support this GPU", "no kernel image is available",
      r"no kernel image is available for execution on the device",
      "The wheel was not compiled for this GPU's architecture (too new or too old).",
      "Run `torchdoctor env` for the GPU's compute capability and the build's CUDA version; install a "
      "wheel that lists that architecture.",
      _CUDA, "no kernel image is available for execution on the device",
      "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    # ---------------------------------------------------------------- distributed
    K("pg-not-initialized", DIST, "process group not initialized", "default process group has not been initialized",
      r"Default process group has not been initialized",
      "A torch.distributed call ran before `init_process_group` (or in a process launched without it).",
      "Launch with torchrun and call `dist.init_process_group(...)` before DDP, samplers or collectives; "
      "`torchdoctor dist` checks the environment.",
      "py:distributed/distributed_c10d.py", "Default process group has not been initialized, ",
      "ValueError: Default process group has not been initialized, please make sure to call "
      "init_process_group."),
    K("env-var-missing", DIST, "rendezvous variable not set", "expected, but not set",
      r"environment variable (?P<variable>\w{1,100}) expected, but not set",
      "env:// initialisation reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, which torchrun sets and "
      "plain `python train.py` does not.",
      "Launch with `torchrun --nproc-per-node=N train.py`; `torchdoctor dist` shows what is set.",
      "py:distributed/rendezvous.py", "expected, but not set",
      "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable RANK "
      "expected, but not set", numbers="groups"),
    K("ddp-unused-params", DIST, "DDP: parameters unused in the loss", "expected to have finished reduction",
      r"Expected to have finished reduction in the prior iteration",
      "Some parameters got no gradient in the last step, so DDP's gradient buckets never completed.",
      "Find them (`torchdoctor checkup SCRIPT` reports unused parameters) and remove or use them; "
      "otherwise `find_unused_parameters=True` (slower).",
      "so:libtorch_cpu.so", "Expected to have finished reduction in the prior iteration before starting a "
      "new one.",
      "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
      "This error indicates that your module has parameters that were not used in producing loss.",
      then=(MOD,)),
    K("ddp-ready-twice", DIST, "DDP: a parameter was marked ready twice", "mark a variable ready only once",
      r"Expected to mark a variable ready only once",
      "A parameter was used twice in one backward under DDP (shared weights with activation "
      "checkpointing, or two forward passes before one backward).",
      "Use `static_graph=True` for reused parameters, `use_reentrant=False` in checkpointing, and one "
      "forward per backward.",
      "so:libtorch_cpu.so", "Expected to mark a variable ready only once.",
      "RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the "
      "following reasons: 1) Use of a module parameter outside the `forward` function."),
    K("ddp-model-mismatch", DIST, "ranks built different models", "ddp expects same model across all ranks",
      r"DDP expects same model across all ranks",
      "Ranks constructed models with different parameters (rank-dependent code in `__init__`).",
      "Build the model identically on every rank; seed before constructing it.",
      "so:libtorch_cpu.so", "DDP expects same model across all ranks, but Rank ",
      "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 10 params, while rank 1 has "
      "inconsistent 12 params."),
    K("nccl-watchdog-timeout", DIST, "NCCL collective timed out", "watchdog caught collective operation timeout",
      r"Watchdog caught collective operation timeout",
      "A collective waited longer than the timeout: one rank never reached it (skipped collective, a crash, "
      "slow rank-0-only work such as eval or saving) or the network hung.",
      "Find the rank that is elsewhere: re-run with `TORCH_DISTRIBUTED_DEBUG=DETAIL NCCL_DEBUG=INFO` via "
      "`torchdoctor dist --nproc-per-node N SCRIPT` (per-rank stacks).",
      "ext:torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, CUDA builds",
      "Watchdog caught collective operation timeout: WorkNCCL(",
      "[rank0]:[E ProcessGroupNCCL.cpp:683] [Rank 0] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=57, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for "
      "600059 milliseconds before timing out.", numbers="nccl_timeout",
      code=HANG, groups=("collective-timeout",)),
    K("nccl-error", DIST, "NCCL call failed", "nccl error",
      r"NCCL error(?: in: (?P<where>\S{1,300}))?,? (?P<kind>[\w ]{1,200}?) \(run with NCCL_DEBUG=INFO",
      "An NCCL operation failed; the kind says which: 'unhandled cuda error' (a CUDA failure, often OOM "
      "inside NCCL), 'unhandled system error' (sockets, /dev/shm, a peer exited), 'remote process exited'.",
      "Re-run with `NCCL_DEBUG=INFO` and read the 'Last error' line; `torchdoctor dist` checks GPUs, "
      "interfaces and a test collective.",
      "ext:torch/csrc/distributed/c10d/NCCLUtils.hpp, CUDA builds", "(run with NCCL_DEBUG=INFO for details)",
      "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
      "ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
      "version 2.26.2", numbers="nccl_error"),
    K("nccl-code", DIST, "NCCL error code", "nccl",
      r"\bnccl(?P<code>UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage|RemoteError)"
      r"\b",
      "NCCL's error class: CUDA failure (often out of memory), system call or network failure, invalid "
      "usage (mismatched collectives or devices), or a peer that exited.",
      "Read the 'Last error' line after it; re-run with `NCCL_DEBUG=INFO`; `torchdoctor dist` for the "
      "environment.",
      _NCCL, "ncclUnhandledCudaError: Call to CUDA function failed.",
      "[rank1]: ncclUnhandledCudaError: Call to CUDA function failed.", numbers="groups"),
    K("collective-mismatch", DIST, "ranks called different collectives", "detected mismatch between collectives",
      r"Detected mismatch between collectives on ranks",
      "TORCH_DISTRIBUTED_DEBUG=DETAIL found ranks calling different collectives (order, op or shape).",
      "The message lists both calls: make every rank call the same collectives in the same order.",
      "so:libtorch_cpu.so", "Detected mismatch between collectives on ranks. Rank ",
      "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
      "CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE), but Rank 1 is running collective: "
      "CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST).", code=MISMATCH),
    K("gloo-size-mismatch", DIST, "gloo: ranks disagree on a collective", "received data size doesn't match",
      r"Received data size doesn't match expected size",
      "Ranks ran different collectives or different tensor sizes (gloo aborts where NCCL would hang).",
      "Re-run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` to name the mismatching calls.",
      "so:libtorch_cpu.so", "Received data size doesn't match expected size. Is there a distributed "
      "collective mismatch in your code?",
      "RuntimeError: Received data size doesn't match expected size. Is there a distributed collective "
      "mismatch in your code?", code=MISMATCH),
    K("store-port-in-use", DIST, "rendezvous port already in use", "server socket has failed to listen",
      r"server socket has failed to listen.{0,300}?(?:port: (?P<port>\d+))?",
      "MASTER_PORT is taken, often by a previous job that is still running.",
      "Pick another `--master-port` (or `--rdzv-endpoint=host:PORT`) and check for leftover processes.",
      "so:libtorch_cpu.so", "The server socket has failed to listen on any local network address. ",
      "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
      "address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
      numbers="groups"),
    K("store-connect-timeout", DIST, "could not reach the rendezvous host", "client socket has timed out",
      r"client socket has timed out after (?P<after>\S{1,300}) while trying to connect to \((?P<host>[^,\n]{1,300}), "
      r"(?P<port>\d+)\)",
      "A rank could not connect to MASTER_ADDR:MASTER_PORT: wrong address, firewall, or the master never "
      "started.",
      "Check MASTER_ADDR is reachable from this node and the port is open; `torchdoctor dist` prints what "
      "each rank sees.",
      "so:libtorch_cpu.so", "The client socket has timed out after ",
      "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to "
      "connect to (10.0.0.1, 29500).", numbers="groups"),
    K("elastic-child-failed", DIST, "torchrun: a worker failed", "childfailederror",
      r"ChildFailedError",
      "torchrun's summary that a rank exited non-zero; the cause is that rank's own error above it "
      "(exitcode -9 / SIGKILL usually means the host OOM killer).",
      "Scroll to the first rank's traceback (the 'Root Cause' section names the rank); `torchdoctor dist "
      "--nproc-per-node N SCRIPT` collects every rank's error.",
      "py:distributed/elastic/multiprocessing/errors/__init__.py", "class ChildFailedError",
      "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", wrapper=True),
    K("fork-cuda", DIST, "CUDA used in a forked subprocess", "cannot re-initialize cuda in forked subprocess",
      r"Cannot re-initialize CUDA in forked subprocess",
      "A forked child (DataLoader worker or multiprocessing) touched CUDA initialised in the parent.",
      "Keep CUDA out of Dataset/workers (move to GPU in the main loop); use "
      "`mp.set_start_method('spawn')` or torchrun for multi-process GPU work.",
      "py:cuda/__init__.py", "Cannot re-initialize CUDA in forked subprocess. To use CUDA with ",
      "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
      "must use the 'spawn' start method"),
    K("nccl-async-abort", DIST, "NCCL failure: process taken down", "some nccl operations have failed or timed out",
      r"Some NCCL operations have failed or timed out",
      "After an NCCL failure or timeout the watchdog stops the process to avoid corrupted data.",
      "Look above for the first failing collective (watchdog timeout or NCCL error) and which rank was "
      "elsewhere.",
      "ext:torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, CUDA builds",
      "Some NCCL operations have failed or timed out.",
      "[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
      "kernels, subsequent GPU operations might run on corrupted/incomplete data.", wrapper=True),
    K("no-backend-for-device", DIST, "collective on a tensor the backend cannot handle",
      "no backend type associated with device type",
      r"No backend type associated with device type (?P<device>\w{1,100})",
      "The process group's backend does not support this device (e.g. a CPU tensor with NCCL).",
      "Move the tensor to the rank's GPU before the collective, or init with `backend=\"cpu:gloo,"
      "cuda:nccl\"`.",
      "so:libtorch_cpu.so", "No backend type associated with device type ",
      "RuntimeError: No backend type associated with device type cpu", numbers="groups"),
    K("dp-gather-scalars", DIST, "DataParallel gathered scalar losses", "was asked to gather along dimension 0",
      r"Was asked to gather along dimension 0, but all input tensors were scalars",
      "nn.DataParallel returned one scalar per GPU; you get a vector to reduce.",
      "Call `.mean()` on the gathered loss - or better, move to DistributedDataParallel (faster, "
      "recommended).",
      "py:nn/parallel/_functions.py", "Was asked to gather along dimension 0, but all ",
      "UserWarning: Was asked to gather along dimension 0, but all input tensors were scalars; will instead "
      "unsqueeze and return a vector.", severity="warning"),
    # ---------------------------------------------------------------- mixed precision
    K("unscale-fp16", MP, "GradScaler on fp16 parameters", "attempting to unscale fp16 gradients",
      r"Attempting to unscale FP16 gradients",
      "The model's parameters are float16 (`.half()`); GradScaler needs fp32 master weights.",
      "Keep the model in fp32 and use `torch.autocast` for the forward; remove `.half()`.",
      "py:amp/grad_scaler.py", "Attempting to unscale FP16 gradients.",
      "ValueError: Attempting to unscale FP16 gradients."),
    K("scaler-not-scaled", MP, "GradScaler used without scaler.scale(loss)", "_scale is none",
      r"Attempted (?P<call>\w{1,100}) but _scale is None",
      "`scaler.unscale_`/`scaler.step` ran but the loss was never scaled in this iteration.",
      "Backpropagate through `scaler.scale(loss).backward()` before `scaler.unscale_`/`scaler.step`.",
      "py:amp/grad_scaler.py", "but _scale is None.  ",
      "AssertionError: Attempted step but _scale is None.  This may indicate your script did not use "
      "scaler.scale(loss or outputs) earlier in the iteration.", numbers="groups"),
    K("unscale-twice", MP, "unscale_() called twice per step", "has already been called on this optimizer",
      r"unscale_\(\) has already been called on this optimizer since the last update\(\)",
      "`scaler.unscale_(opt)` ran twice before `scaler.update()`.",
      "Call unscale_ once per optimizer per step, before clipping; then `step` and `update`.",
      "py:amp/grad_scaler.py", "unscale_() has already been called on this optimizer since the last update().",
      "RuntimeError: unscale_() has already been called on this optimizer since the last update()."),
    K("no-inf-checks", MP, "scaler.step() saw no gradients", "no inf checks were recorded",
      r"No inf checks were recorded",
      "`scaler.step(opt)` found no gradients: backward was not run through `scaler.scale(loss)`, or the "
      "optimizer holds no parameters with gradients.",
      "Use `scaler.scale(loss).backward()` and check the optimizer's parameters receive gradients.",
      "py:amp/grad_scaler.py", "No inf checks were recorded for this optimizer.",
      "AssertionError: No inf checks were recorded for this optimizer."),
    K("amp-deprecated", MP, "deprecated torch.cuda.amp API", "is deprecated. please use `torch.amp",
      r"torch\.cuda\.amp\.(?P<api>autocast|GradScaler)\(args\.\.\.\)`? is deprecated",
      "torch.cuda.amp.* still works but is deprecated.",
      "Use `torch.amp.autocast(\"cuda\", ...)` and `torch.amp.GradScaler(\"cuda\")`.",
      "py:cuda/amp/grad_scaler.py", "`torch.cuda.amp.GradScaler(args...)` is deprecated. ",
      "FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
      "`torch.amp.GradScaler('cuda', args...)` instead.", severity="warning", numbers="groups"),
    K("scaler-without-cuda", MP, "GradScaler disabled: no CUDA", "gradscaler is enabled, but cuda is not available",
      r"GradScaler is enabled, but CUDA is not available",
      "The scaler turned itself off because CUDA is not available: this run is not doing what you think.",
      "Check `torch.cuda.is_available()` (`torchdoctor env`); on CPU use bf16 autocast without a scaler.",
      "py:amp/grad_scaler.py", "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
      "UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
      severity="warning"),
    K("autocast-dtype", MP, "autocast dtype not supported here", "autocast, but the target dtype is not supported",
      r"autocast, but the target dtype is not supported",
      "autocast was asked for a dtype this device does not support, so it is disabled.",
      "Use bfloat16 on CPU; check the GPU supports the dtype (bf16 needs Ampere or newer).",
      "py:amp/autocast_mode.py", "autocast, but the target dtype is not supported. Disabling autocast.",
      "UserWarning: In CPU autocast, but the target dtype is not supported. Disabling autocast.",
      severity="warning"),
    K("autocast-no-cuda", MP, "autocast disabled: no CUDA", "cuda is not available or torch_xla is imported",
      r"CUDA is not available or torch_xla is imported\. Disabling autocast",
      "autocast('cuda') was requested on a machine without CUDA: it runs in fp32.",
      "Check the device (`torchdoctor env`); use autocast('cpu', dtype=torch.bfloat16) on CPU.",
      "py:amp/autocast_mode.py", "CUDA is not available or torch_xla is imported. Disabling autocast.",
      "UserWarning: CUDA is not available or torch_xla is imported. Disabling autocast.",
      severity="warning"),
    K("bce-autocast", MP, "BCELoss under autocast", "unsafe to autocast",
      r"binary_cross_entropy and torch\.nn\.BCELoss are unsafe to autocast",
      "BCELoss on fp16 probabilities is numerically unsafe; autocast refuses it.",
      "Drop the sigmoid and use `BCEWithLogitsLoss` / `binary_cross_entropy_with_logits`.",
      "so:libtorch_cpu.so", "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
      "autocast.",
      "RuntimeError: torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast."),
    K("half-not-implemented", MP, "op has no float16/bfloat16 kernel on this device", "not implemented for '",
      r"\"(?P<op>\w{1,100})\" not implemented for '(?P<dtype>Half|BFloat16|ComplexHalf)'",
      "A half-precision tensor reached an op without a kernel for that dtype (often fp16 on CPU).",
      "Use autocast instead of `.half()` (it keeps unsupported ops in fp32); on CPU use bfloat16.",
      "so:libtorch_cpu.so", "\" not implemented for '",
      "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'", numbers="groups"),
    K("half-overflow", MP, "value overflows float16", "without overflow",
      r"value cannot be converted to type (?P<dtype>[\w:]{1,100}) without overflow",
      "A constant or fill value exceeds the dtype's range (float16 max is 65504), e.g. a -1e9 mask.",
      "Use `torch.finfo(x.dtype).min` for masks instead of a literal, or bf16.",
      "so:libtorch_cpu.so", "value cannot be converted to type ",
      "RuntimeError: value cannot be converted to type at::Half without overflow", numbers="groups"),
    K("tf32-available", MP, "TF32 available but off", "tensorfloat32 tensor cores for float32 matrix multiplication",
      r"TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled",
      "fp32 matmuls on this GPU could use TF32 tensor cores and do not.",
      "Measure first (`torchdoctor profile SCRIPT`); then `torch.set_float32_matmul_precision(\"high\")`.",
      "py:_inductor/compile_fx.py", "TensorFloat32 tensor cores for float32 matrix multiplication available "
      "but not enabled. ",
      "UserWarning: TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled. "
      "Consider setting `torch.set_float32_matmul_precision('high')` for better performance.",
      severity="warning", then=(PERF,)),
    K("scheduler-order", MP, "lr_scheduler.step() before optimizer.step()", "before `optimizer.step()`",
      r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`",
      "The scheduler stepped before any optimizer step: harmless once if GradScaler skipped the first "
      "(inf) steps; otherwise the calls are in the wrong order and the first LR value is skipped.",
      "Call `optimizer.step()` (or `scaler.step(opt)`) before `scheduler.step()`.",
      "py:optim/lr_scheduler.py", "Detected call of `lr_scheduler.step()` before `optimizer.step()`. ",
      "UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`. In PyTorch 1.1.0 and "
      "later, you should call them in the opposite order: `optimizer.step()` before `lr_scheduler.step()`.",
      severity="warning"),
    # ---------------------------------------------------------------- performance / data loading / compile
    K("dl-too-many-workers", PERF, "more DataLoader workers than cores", "our suggested max number of worker",
      r"This DataLoader will create (?P<workers>\d+) worker processes in total\. Our suggested max number "
      r"of worker in current system is (?P<suggested>\d+)|Our suggested max number of worker in current "
      r"system is (?P<suggested2>\d+)",
      "num_workers exceeds the CPUs this process may use; workers fight for cores (slow, can freeze).",
      "Set num_workers to at most the suggested number; `torchdoctor profile SCRIPT` shows whether data "
      "loading is the bottleneck.",
      _PY_DL, "Our suggested max number of worker in current system is ",
      "UserWarning: This DataLoader will create 16 worker processes in total. Our suggested max number of "
      "worker in current system is 4, which is smaller than what this DataLoader is going to create.",
      severity="warning", numbers="groups"),
    K("dl-timeout", PERF, "DataLoader batch timed out", "dataloader timed out after",
      r"DataLoader timed out after (?P<seconds>\d+) seconds",
      "A worker did not deliver a batch within `timeout`: slow I/O, a deadlock in `__getitem__`, or a "
      "starved worker.",
      "Time `dataset[i]` alone; `torchdoctor profile SCRIPT --timeout S` shows data wait and where it "
      "was stuck.",
      _PY_DL, "DataLoader timed out after ",
      "RuntimeError: DataLoader timed out after 30 seconds", numbers="groups"),
    K("too-many-open-files", PERF, "too many open files in DataLoader", "too many open files. communication",
      r"Too many open files\. Communication with the workers is no longer possible",
      "Workers share tensors through file descriptors and hit `ulimit -n`.",
      "Raise `ulimit -n`, or `torch.multiprocessing.set_sharing_strategy('file_system')`; fewer workers.",
      _PY_DL, "Too many open files. Communication with the",
      "RuntimeError: Too many open files. Communication with the workers is no longer possible. Please "
      "increase the limit using `ulimit -n` in the shell or change the sharing strategy by calling "
      "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code"),
    K("recompile-limit", PERF, "torch.compile recompiles too often", "torch._dynamo hit config.",
      r"torch\._dynamo hit config\.(?P<limit>\w{1,100}) \((?P<value>\d+)\)",
      "The function was recompiled until the limit, then runs eagerly: shapes, dtypes or Python values "
      "change between calls.",
      "Run with `TORCH_LOGS=recompiles` to see the guard that fails; mark dynamic dimensions or pad "
      "shapes.",
      "py:_dynamo/convert_frame.py", "torch._dynamo hit config.%s (%s)",
      "W1105 12:00:01.123000 1234 torch/_dynamo/convert_frame.py:1016] torch._dynamo hit "
      "config.recompile_limit (8)", severity="warning", numbers="groups"),
    K("graph-break", PERF, "torch.compile graph break", "graph break",
      r"Graph break(?: in user code at (?P<where>\S{1,300}))?",
      "Dynamo split the graph here; each break costs a return to Python and fewer fusions.",
      "Run `TORCH_LOGS=graph_breaks` and fix the top break (often `.item()`, print, data-dependent "
      "Python control flow).",
      "py:_dynamo/symbolic_convert.py", "Graph break in user code at ",
      "V1105 12:00:01.123000 1234 torch/_dynamo/symbolic_convert.py:444] Graph break in user code at "
      "/work/model.py:42", severity="warning", numbers="groups"),
    K("dynamo-unsupported", PERF, "torch.compile cannot trace this code", "torch._dynamo.exc.unsupported",
      r"torch\._dynamo\.exc\.Unsupported",
      "Dynamo met code it cannot trace (fullgraph=True turns the break into this error).",
      "Read the explanation and user stack in the message; rewrite that line or drop fullgraph=True.",
      "py:_dynamo/exc.py", "class Unsupported(",
      "torch._dynamo.exc.Unsupported: Dynamic shape operator"),
    K("backend-compiler-failed", PERF, "torch.compile backend crashed", "backendcompilerfailed",
      r"BackendCompilerFailed",
      "The compiler backend (inductor) failed on a graph; eager mode is unaffected.",
      "Confirm the model runs eagerly; isolate with `torch._dynamo.explain` or "
      "`TORCH_COMPILE_DEBUG=1`; report with the minifier's repro.",
      "py:_dynamo/exc.py", "class BackendCompilerFailed(",
      "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:"),
    K("inductor-error", PERF, "inductor compilation error", "inductorerror",
      r"torch\._inductor\.exc\.InductorError",
      "Inductor failed to compile a kernel (C++/Triton compiler missing or a codegen bug).",
      "Check a C++ compiler is present (`torchdoctor env`); run eagerly to confirm; report with "
      "`TORCH_COMPILE_DEBUG=1` output.",
      "py:_inductor/exc.py", "class InductorError(",
      "torch._inductor.exc.InductorError: CppCompileError: C++ compile error"),
    K("cudagraph-skipped", PERF, "CUDA graphs skipped", "skipping cudagraphs due to",
      r"skipping cudagraphs due to (?P<reason>.{1,300})",
      "torch.compile's CUDA graphs were not used for this graph (CPU tensors, mutation, dynamic shapes).",
      "Fix the reason named, or accept eager launch costs; measure with `torchdoctor profile SCRIPT`.",
      "py:_dynamo/backends/cudagraphs.py", "skipping cudagraphs due to ",
      "skipping cudagraphs due to mutated inputs (2 instances)", severity="warning", numbers="groups"),
    # ---------------------------------------------------------------- checkpointing / reproducibility
    K("deserialize-no-cuda", CKPT, "checkpoint saved on GPU, loading without CUDA",
      "attempting to deserialize object on a cuda device",
      r"Attempting to deserialize object on a CUDA device but torch\.cuda\.is_available\(\) is False",
      "The checkpoint's tensors were saved on CUDA and this machine has none.",
      "Load with `torch.load(path, map_location=\"cpu\")`; `torchdoctor checkpoint-audit PATH` lists "
      "device tensors.",
      "py:serialization.py", "Attempting to deserialize object on a ",
      "RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is "
      "False. If you are running on a CPU-only machine, please use torch.load with "
      "map_location=torch.device('cpu') to map your storages to the CPU."),
    K("deserialize-device-count", CKPT, "checkpoint saved on a GPU index this machine lacks",
      "attempting to deserialize object on cuda device",
      r"Attempting to deserialize object on CUDA device (?P<device>\d+) but torch\.cuda\.device_count\(\) is "
      r"(?P<count>\d+)",
      "Tensors were saved on cuda:N and this machine has fewer GPUs.",
      "Load with `map_location=\"cuda:0\"` (or a dict mapping); save from `model.cpu().state_dict()` to "
      "avoid it.",
      "py:serialization.py", "Attempting to deserialize object on ",
      "RuntimeError: Attempting to deserialize object on CUDA device 3 but torch.cuda.device_count() is 1. "
      "Please use torch.load with map_location to map your storages to an existing device.",
      numbers="groups"),
    K("state-dict-keys", CKPT, "state_dict keys do not match the model", "error(s) in loading state_dict",
      r"Error\(s\) in loading state_dict for (?P<model>\w{1,100})",
      "Saved keys differ from the model's: a `module.` (DDP) or `_orig_mod.` (torch.compile) prefix, a "
      "changed architecture, or a whole-model vs state_dict mix-up.",
      "Compare the key lists (`torchdoctor checkpoint-audit PATH` shows prefixes); strip the prefix or "
      "save `model.module.state_dict()`; `strict=False` only for intended partial loads.",
      "py:nn/modules/module.py", "Error(s) in loading state_dict for {}:",
      "RuntimeError: Error(s) in loading state_dict for ResNet:\n\tMissing key(s) in state_dict: "
      "\"conv1.weight\". \n\tUnexpected key(s) in state_dict: \"module.conv1.weight\". ",
      numbers="state_dict_keys", generic=True),
    K("state-dict-size", CKPT, "parameter shape differs from the checkpoint", "size mismatch for",
      r"size mismatch for (?P<key>[\w.]{1,300}): copying a param with shape (?P<saved>torch\.Size\(\[[^\]\n]{0,300}\]\)) "
      r"from checkpoint, the shape in current model is (?P<model>torch\.Size\(\[[^\]\n]{0,300}\]\))",
      "A layer has a different size than when saved (e.g. another number of classes).",
      "Build the model with the saved configuration, or skip that layer's keys when fine-tuning a new "
      "head.",
      "py:nn/modules/module.py", "size mismatch for {key}: copying a param with shape ",
      "size mismatch for fc.weight: copying a param with shape torch.Size([10, 512]) from checkpoint, the "
      "shape in current model is torch.Size([100, 512]).", numbers="groups"),
    K("weights-only-failed", CKPT, "torch.load refused a pickled object", "weights only load failed",
      r"Weights only load failed",
      "Since torch 2.6 `torch.load` defaults to weights_only=True and this file pickles other objects "
      "(numpy arrays, a whole model, custom classes).",
      "Inspect it without running code: `torchdoctor checkpoint-audit PATH` lists the globals; allowlist "
      "the safe ones with `torch.serialization.add_safe_globals`, or weights_only=False only for files "
      "you trust.",
      "py:serialization.py", "Weights only load failed. ",
      "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have "
      "two options, do those steps only if you trust the source of the checkpoint.", numbers="globals",
      groups=("weights-only",)),
    K("unsupported-global", CKPT, "pickled global not allowed by weights_only", "was not an allowed global by default",
      r"Unsupported global: GLOBAL (?P<global_name>[\w.]{1,300}) was not an allowed global by default",
      "The checkpoint references a Python object weights_only loading does not allow.",
      "If it is a safe type (e.g. numpy arrays), allowlist it with `torch.serialization.add_safe_globals`; "
      "`torchdoctor checkpoint-audit PATH` lists all of them.",
      "py:_weights_only_unpickler.py", "was not an allowed global by default. ",
      "WeightsUnpickler error: Unsupported global: GLOBAL numpy.core.multiarray._reconstruct was not an "
      "allowed global by default.", numbers="groups"),
    K("zip-truncated", CKPT, "checkpoint file truncated or corrupt", "failed finding central directory",
      r"failed finding central directory",
      "The zip container is incomplete: the save was interrupted, the disk filled, or the copy is partial.",
      "Use an earlier checkpoint; save to a temporary file then `os.replace` so a crash never leaves a "
      "half-written file; `torchdoctor checkpoint-audit PATH` checks a file.",
      "so:libtorch_cpu.so", "failed finding central directory",
      "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"),
    K("invalid-load-key", CKPT, "not a torch checkpoint", "invalid load key",
      r"invalid load key, '(?P<byte>[^'\n]{0,300})'",
      "The file is not a torch/pickle file: a Git LFS pointer, an HTML error page, or a safetensors/other "
      "format.",
      "Look at the first bytes (`head -c 200 file`); fetch the real file (`git lfs pull`); "
      "`torchdoctor checkpoint-audit PATH` names the format.",
      "ext:CPython Modules/_pickle.c", "invalid load key, ",
      "_pickle.UnpicklingError: invalid load key, 'v'.", numbers="groups"),
    K("optim-group-size", CKPT, "optimizer state does not fit the model", "doesn't match the size of optimizer's group",
      r"loaded state dict contains a parameter group that doesn't match the size of optimizer's group",
      "The saved optimizer state was built for different parameters (model changed, or parameters in "
      "another order/grouping).",
      "Build the optimizer exactly as when saving; `torchdoctor checkpoint-audit PATH` compares the counts.",
      "py:optim/optimizer.py", "that doesn't match the size of optimizer's group",
      "ValueError: loaded state dict contains a parameter group that doesn't match the size of optimizer's "
      "group"),
    K("optim-group-count", CKPT, "optimizer has a different number of parameter groups",
      "loaded state dict has a different number of parameter groups",
      r"loaded state dict has a different number of parameter groups",
      "The saved optimizer had a different param_groups layout.",
      "Create the optimizer with the same param groups as when saving.",
      "py:optim/optimizer.py", "loaded state dict has a different number of parameter groups",
      "ValueError: loaded state dict has a different number of parameter groups"),
    K("weights-only-false-warning", CKPT, "torch.load with weights_only=False (warning)",
      "you are using `torch.load` with `weights_only=false`",
      r"You are using `torch\.load` with `weights_only=False`",
      "torch 2.4-2.5 warned that loading runs arbitrary pickled code and that the default would change "
      "(it did in 2.6).",
      "Save state_dicts (tensors and plain containers) so weights_only=True loads them; "
      "`torchdoctor checkpoint-audit PATH` shows what the file needs.",
      "ext:torch/serialization.py in torch 2.4-2.5", "You are using `torch.load` with `weights_only=False`",
      "FutureWarning: You are using `torch.load` with `weights_only=False` (the current default value), "
      "which uses the default pickle module implicitly.", severity="warning"),
    K("pickle-class-missing", CKPT, "whole pickled model needs its class", "can't get attribute",
      r"Can't get attribute '(?P<name>\w{1,100})' on <module '(?P<module>[\w.]{1,300})'",
      "The file pickles a whole object (model) whose class is not importable here.",
      "Save and load `state_dict()` instead of the module; to rescue this file import the class under the "
      "same module name first.",
      "ext:CPython Lib/pickle.py", "Can't get attribute ",
      "AttributeError: Can't get attribute 'Net' on <module '__main__' from 'eval.py'>", numbers="groups"),
    K("deterministic-cublas", CKPT, "deterministic mode needs CUBLAS_WORKSPACE_CONFIG",
      "not deterministic because it uses cublas",
      r"not deterministic because it uses CuBLAS",
      "With `torch.use_deterministic_algorithms(True)`, cuBLAS needs a fixed workspace configuration.",
      "Set `CUBLAS_WORKSPACE_CONFIG=:4096:8` in the environment before the process starts.",
      "ext:aten/src/ATen/Context.cpp, CUDA builds", "but this operation is not deterministic because it "
      "uses CuBLAS and you have CUDA >= 10.2",
      "RuntimeError: Deterministic behavior was enabled with either `torch.use_deterministic_algorithms"
      "(True)` or `at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic "
      "because it uses CuBLAS and you have CUDA >= 10.2."),
    K("nondeterministic-op", CKPT, "op has no deterministic implementation",
      "does not have a deterministic implementation",
      r"\b(?P<op>\w{1,100}) does not have a deterministic implementation",
      "Deterministic mode is on and this op (often a CUDA scatter/index backward) has no deterministic "
      "kernel.",
      "Use `torch.use_deterministic_algorithms(True, warn_only=True)` to list all such ops, then replace "
      "them or accept the nondeterminism for that op.",
      "so:libtorch_cpu.so", " does not have a deterministic implementation, but you set "
      "'torch.use_deterministic_algorithms(True)'.",
      "RuntimeError: index_add_cuda_ does not have a deterministic implementation, but you set "
      "'torch.use_deterministic_algorithms(True)'.", numbers="groups"),
    # ---------------------------------------------------------------- custom autograd
    K("grad-count", AG, "backward returned the wrong number of gradients",
      "returned an incorrect number of gradients",
      r"function (?P<function>\w{1,100}) returned an incorrect number of gradients \(expected (?P<expected>\d+), "
      r"got (?P<got>\d+)\)",
      "A custom Function's backward must return one value per forward input (None for non-tensors).",
      "Return a tuple as long as forward's inputs (after ctx), with None for inputs without gradient.",
      "so:libtorch_cpu.so", " returned an incorrect number of gradients (expected ",
      "RuntimeError: function MyReluBackward returned an incorrect number of gradients (expected 2, got 1)",
      numbers="groups"),
    K("grad-shape", AG, "backward returned a gradient of the wrong shape", "invalid gradient at index",
      r"returned an invalid gradient at index (?P<index>\d+) - got (?P<got>\[[^\]\n]{0,300}\]) but expected shape "
      r"compatible with (?P<expected>\[[^\]\n]{0,300}\])",
      "A custom backward returned a gradient whose shape does not match its input.",
      "Reduce broadcast dimensions (sum over them) so each gradient has its input's shape; check with "
      "`torch.autograd.gradcheck`.",
      "so:libtorch_cpu.so", "invalid gradient at index ",
      "RuntimeError: Function MyScaleBackward returned an invalid gradient at index 1 - got [8, 4] but "
      "expected shape compatible with [4]", numbers="groups"),
    K("jacobian-mismatch", AG, "gradcheck: analytical and numerical gradients differ", "mismatch for output",
      r"Jacobian (?:\w{1,100} )?mismatch for output (?P<output>\d+) with respect to input (?P<input>\d+)",
      "The custom backward's gradient differs from finite differences.",
      "Run gradcheck in float64 with small inputs; check each returned gradient's formula and its "
      "reduction over broadcast dimensions.",
      "py:autograd/gradcheck.py", "mismatch for output {output_idx:d} with respect to input ",
      "torch.autograd.gradcheck.GradcheckError: Jacobian mismatch for output 0 with respect to input 0,",
      numbers="groups"),
    K("not-reentrant", AG, "backward is not reentrant", "backward is not reentrant",
      r"Backward is not reentrant",
      "Calling backward twice with the same inputs gave different gradients: the backward keeps state "
      "or is nondeterministic.",
      "Do not mutate ctx or saved tensors in backward; use deterministic ops there.",
      "py:autograd/gradcheck.py", "Backward is not reentrant, i.e., running backward with ",
      "torch.autograd.gradcheck.GradcheckError: Backward is not reentrant, i.e., running backward with same "
      "input and grad_output multiple times gives different values, although analytical gradient matches "
      "numerical gradient."),
    K("legacy-function", AG, "old-style autograd.Function", "legacy autograd function with non-static forward",
      r"Legacy autograd function with non-static forward method is deprecated",
      "The Function defines forward/backward as instance methods, which are no longer supported.",
      "Make `forward(ctx, ...)` and `backward(ctx, ...)` `@staticmethod`s and call `MyFn.apply(...)`.",
      "py:autograd/function.py", "Legacy autograd function with non-static forward method is deprecated. ",
      "RuntimeError: Legacy autograd function with non-static forward method is deprecated. Please use "
      "new-style autograd function with static forward method."),
    K("save-for-backward-type", AG, "save_for_backward got a non-tensor", "save_for_backward can only save",
      r"save_for_backward can only save variables, but argument (?P<index>\d+) is of type (?P<type>\w{1,100})",
      "`ctx.save_for_backward` stores tensors only.",
      "Keep non-tensors as plain ctx attributes (`ctx.scale = scale`).",
      "so:libtorch_python.so", "save_for_backward can only save variables, but argument {} is of type {}",
      "TypeError: save_for_backward can only save variables, but argument 1 is of type float",
      numbers="groups"),
)

def R(id, skill, key, pattern, sample, *, who, **kw):  # noqa: N802 - a rule's own row (ask skips it)
    return Known(id, skill, kw.pop("title", id.replace("-", " ")), key, pattern, "", "", f"rule:{who}", "",
                 sample, ask=False, **kw)


_CRASH, _RANKS = "rules/crash.py", "distributed/failtext.py"
_CKPT_HINT = "checkpoint/state_dict mismatch: compare keys and shapes (torchdoctor checkpoint-audit PATH)"
_DIST_HINT = "distributed set-up or collective failure: run torchdoctor dist"
_SHAPE_HINT = ("a layer's expected input shape differs from what it receives: print the shapes at the "
               "failing line")
_GRAPH_HINT = ("autograd graph misuse: detach tensors kept across steps, or pass retain_graph=True only "
               "where a second backward is intended")
_ASSERT_HINT = ("re-run with CUDA_LAUNCH_BLOCKING=1 to get the failing line (often an index/label out of "
                "range)")

RULE_ROWS: tuple[Known, ...] = (
    # ------------------------------------------------ the crash rule: what a script's exception is
    # out of memory, any allocator (the ask rows above name which one)
    R("cpu-alloc-any", MEM, "defaultcpuallocator: ", r"DefaultCPUAllocator: (?:can't|not enough memory)",
      "RuntimeError: DefaultCPUAllocator: not enough memory: you tried to allocate 1000 bytes.",
      who=_CRASH, code=OOM),
    R("out-of-memory-any", MEM, "out of memory", r"\bout of memory\b",
      "RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB", who=_CRASH, code=OOM),
    R("inplace-any", DBG, "modified by an inplace operation", r"(?-i:modified by an inplace operation)",
      "RuntimeError: a leaf Variable was modified by an inplace operation", who=_CRASH, code=INPLACE),
    # device mismatch in its other wordings (the first one is the ask row "device-mismatch")
    R("input-weight-device", MOD, "and weight type (",
      r"(?-i:Input type \(\S+\) and weight type \(\S+\) should be the same)",
      "RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same",
      who=_CRASH, code=DEVICE),
    R("device-type-expected", MOD, "but got device type", r"(?-i:Expected object of device type \w+ but got "
      r"device type \w+)", "RuntimeError: Expected object of device type cuda but got device type cpu for "
      "argument #1 'self'", who=_CRASH, code=DEVICE),
    R("tensor-on-device", MOD, "to be on ", r"(?-i:is on \w+, but expected (it )?to be on \w+)",
      "RuntimeError: Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU", who=_CRASH,
      code=DEVICE),
    R("indices-device", MOD, "indices should be either on cpu or on the same device",
      r"(?-i:indices should be either on cpu or on the same device)",
      "RuntimeError: indices should be either on cpu or on the same device as the indexed tensor (cpu)",
      who=_CRASH, code=DEVICE),
    R("generator-device", MOD, "device type for generator", r"(?-i:Expected a '\w+' device type for generator)",
      "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'", who=_CRASH, code=DEVICE),
    R("not-on-expected-device", MOD, "is not on the expected device",
      r"(?-i:Tensor on device \S+ is not on the expected device \S+!)",
      "RuntimeError: Tensor on device cpu is not on the expected device meta!", who=_CRASH, code=DEVICE),
    # a plain script-crashed routed to a skill: the first row that matches anywhere in the message wins
    R("route-state-dict", CKPT, "error(s) in loading state_dict", r"(?-i:Error\(s\) in loading state_dict)",
      "RuntimeError: Error(s) in loading state_dict for Net:", who=_CRASH, groups=("crash-route",),
      hint=_CKPT_HINT),
    R("route-unexpected-keys", CKPT, "unexpected key(s)", r"(?-i:Unexpected key\(s\))",
      "Unexpected key(s) in state_dict: \"x\"", who=_CRASH, groups=("crash-route",), hint=_CKPT_HINT),
    R("route-missing-keys", CKPT, "missing key(s)", r"(?-i:Missing key\(s\))",
      "Missing key(s) in state_dict: \"x\"", who=_CRASH, groups=("crash-route",), hint=_CKPT_HINT),
    R("route-stream-reader", CKPT, "pytorchstreamreader", r"(?-i:PytorchStreamReader)",
      "RuntimeError: PytorchStreamReader failed reading zip archive", who=_CRASH, groups=("crash-route",),
      hint=_CKPT_HINT),
    R("route-nccl", DIST, "nccl", r"NCCL", "torch.distributed.DistBackendError: NCCL error", who=_CRASH,
      groups=("crash-route",), hint=_DIST_HINT),
    R("route-process-group", DIST, "processgroup", r"ProcessGroup", "RuntimeError: ProcessGroupGloo failed",
      who=_CRASH, groups=("crash-route",), hint=_DIST_HINT),
    R("route-c10d", DIST, "c10d", r"c10d", "RuntimeError: c10d store failed", who=_CRASH,
      groups=("crash-route",), hint=_DIST_HINT),
    R("route-init-process-group", DIST, "init_process_group", r"init_process_group",
      "ValueError: init_process_group was called twice", who=_CRASH, groups=("crash-route",), hint=_DIST_HINT),
    R("route-collective", DIST, "collective", r"collective", "RuntimeError: the collective failed",
      who=_CRASH, groups=("crash-route",), hint=_DIST_HINT),
    R("route-matmul-shapes", MOD, "mat1 and mat2 shapes cannot be multiplied",
      r"(?-i:mat1 and mat2 shapes cannot be multiplied)",
      "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)", who=_CRASH,
      groups=("crash-route",), hint=_SHAPE_HINT),
    R("route-size-mismatch", MOD, "size mismatch", r"(?-i:size mismatch)",
      "RuntimeError: size mismatch, m1: [2 x 3]", who=_CRASH, groups=("crash-route",), hint=_SHAPE_HINT),
    R("route-invalid-shape", MOD, "is invalid for input of size",
      r"(?-i:shape .* is invalid for input of size)",
      "RuntimeError: shape '[2, 5]' is invalid for input of size 7", who=_CRASH, groups=("crash-route",),
      hint=_SHAPE_HINT),
    R("route-conv-groups", MOD, "given groups=", r"(?-i:Given groups=\d+, weight of size)",
      "RuntimeError: Given groups=1, weight of size [8, 3, 3, 3], expected input[1, 4, 8, 8] to have 3 "
      "channels",
      who=_CRASH, groups=("crash-route",), hint=_SHAPE_HINT),
    R("route-expected-input", MOD, "expected input[", r"(?-i:expected input\[.*\] to have)",
      "RuntimeError: expected input[1, 4] to have 3 channels", who=_CRASH, groups=("crash-route",),
      hint=_SHAPE_HINT),
    R("route-backward-twice", AG, "trying to backward through the graph a second time",
      r"(?-i:Trying to backward through the graph a second time)",
      "RuntimeError: Trying to backward through the graph a second time", who=_CRASH, groups=("crash-route",),
      hint=_GRAPH_HINT),
    R("route-no-grad-fn", AG, "does not require grad and does not have a grad_fn",
      r"(?-i:does not require grad and does not have a grad_fn)",
      "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn", who=_CRASH,
      groups=("crash-route",), hint=_GRAPH_HINT),
    R("route-saved-variable", AG, "one of the variables needed for gradient computation",
      r"(?-i:one of the variables needed for gradient computation)",
      "RuntimeError: one of the variables needed for gradient computation has been freed", who=_CRASH,
      groups=("crash-route",), hint=_GRAPH_HINT),
    R("route-device-assert", DBG, "device-side assert triggered", r"(?-i:device-side assert triggered)",
      "RuntimeError: CUDA error: device-side assert triggered", who=_CRASH, groups=("crash-route",),
      hint=_ASSERT_HINT),
    R("route-illegal-access", DBG, "cuda error: an illegal memory access",
      r"(?-i:CUDA error: an illegal memory access)",
      "RuntimeError: CUDA error: an illegal memory access was encountered", who=_CRASH,
      groups=("crash-route",), hint=_ASSERT_HINT),
    # ------------------------------------------------ the cross-rank rules: what collective failures print
    # ranks called different collectives or shapes (gloo, NCCL, TORCH_DISTRIBUTED_DEBUG=DETAIL)
    R("mismatch-detected", DIST, "detected mismatch between collectives",
      r"Detected mismatch between collectives",
      "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective",
      who=_RANKS, code=MISMATCH, groups=("collective-mismatch",)),
    R("mismatch-size", DIST, "size doesn't match expected size", r"size doesn't match expected size",
      "RuntimeError: Received data size doesn't match expected size.", who=_RANKS, code=MISMATCH,
      groups=("collective-mismatch",)),
    R("mismatch-words", DIST, "collective mismatch", r"collective mismatch",
      "Is there a distributed collective mismatch in your code?", who=_RANKS, code=MISMATCH,
      groups=("collective-mismatch",)),
    R("mismatch-between", DIST, "mismatch between collective", r"Mismatch between collective",
      "RuntimeError: Mismatch between collective operations", who=_RANKS, code=MISMATCH,
      groups=("collective-mismatch",)),
    # a peer rank went away (crashed, killed)
    R("peer-closed", DIST, "connection closed by peer", r"Connection closed by peer",
      "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
      "[127.0.0.1]:29500", who=_RANKS, groups=("peer-gone",)),
    R("peer-reset", DIST, "connection reset by peer", r"Connection reset by peer",
      "RuntimeError: Connection reset by peer", who=_RANKS, groups=("peer-gone",)),
    R("broken-pipe", DIST, "broken pipe", r"Broken pipe",
      "RuntimeError: [pair.cc:589] Write error: Broken pipe",
      who=_RANKS, groups=("peer-gone",)),
    R("nccl-aborted", DIST, "nccl communicator was aborted", r"NCCL communicator was aborted",
      "RuntimeError: NCCL communicator was aborted on rank 1.", who=_RANKS, groups=("peer-gone",)),
    R("remote-exited", DIST, "remote process exited", r"remote process exited",
      "DistBackendError: NCCL error: remote process exited or there was a network error", who=_RANKS,
      groups=("peer-gone",)),
    # a collective never completed (the first wording is the ask row "nccl-watchdog-timeout")
    R("collective-wait-timeout", DIST, "for collective", r"Timed out waiting .* for collective",
      "RuntimeError: Timed out waiting 1800000ms for collective", who=_RANKS, code=HANG,
      groups=("collective-timeout",)),
    # any other sign of the distributed transport in an error line
    R("transport-process-group", DIST, "processgroup", r"ProcessGroup", "[E ProcessGroupNCCL.cpp:1] error",
      who=_RANKS, groups=("collective-transport",)),
    R("transport-c10d", DIST, "c10d", r"c10d", "torch/csrc/distributed/c10d/Utils.hpp:1", who=_RANKS,
      groups=("collective-transport",)),
    R("transport-gloo", DIST, "gloo", r"gloo", "gloo/transport/tcp/pair.cc", who=_RANKS,
      groups=("collective-transport",)),
    R("transport-nccl", DIST, "nccl", r"NCCL", "NCCL WARN Call to connect returned", who=_RANKS,
      groups=("collective-transport",)),
)

TABLE: tuple[Known, ...] = ASK_ROWS + RULE_ROWS
KNOWN: tuple[Known, ...] = tuple(k for k in TABLE if k.ask)  # the rows ``ask`` scans, in order
BY_ID: dict[str, Known] = {k.id: k for k in TABLE}
