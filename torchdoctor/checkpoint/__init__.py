"""Checkpoint audit: read what a checkpoint holds and lacks without running its code.

Layers (docs/architecture.md): readers (``detect``, ``folders``, ``torch_zip``, ``torch_legacy``,
``safetensors``, ``dcp``) turn a path into a :class:`~torchdoctor.checkpoint.values.Contents`
(plain Python containers, :class:`TensorInfo` leaves, :class:`Opaque` for every object
whose class was *not* imported); ``pickle_scan`` lists the globals a pickle would import
from its opcodes; ``scan`` checks tensor bytes for NaN/Inf in bounded memory; ``roles``
recognises model / optimizer / scheduler / scaler / RNG / progress; ``evidence`` and ``derive``
gather all that, with the facts derived from it once (``parts``, ``pickle_globals``), and the rules
in ``torchdoctor/rules/checkpoint_*.py`` turn it into findings (pure functions, judged by
``torchdoctor.judge``). Nothing here imports torch unless ``--model`` or
``--unsafe-load`` asks for it. ``fsutil`` refuses FIFOs/devices and links that leave a folder
before anything is opened; every reader bounds what it reads (docs/checkpoint.md, "Bounds on
hostile input").
"""
