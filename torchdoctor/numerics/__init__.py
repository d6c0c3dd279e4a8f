"""Helpers of the numerics and training-bug instruments (used inside the child process).

``tensors``: which tensors an object holds, exact stats of one tensor. ``names``: module and
parameter names for messages. ``checkmode``: a dispatch mode that names the first op whose
output turns non-finite. Nothing here judges: rules live in ``torchdoctor.rules``.
Every module imports torch lazily or only when used inside the child.
"""
