"""Checking custom autograd Functions on the calls a script really made (``torchdoctor gradcheck``).

Measurement side, run in the child process after the bounded run (``instruments/training/autograd_capture.py``):

* ``limits.py``: the bounds and tolerances (no torch: the rules read the same constants);
* ``capture.py``: bounded copies of real calls (detached, on the host), the sample book;
* ``prepare.py``: float64 copies on the call's device and the reduced sub-problem;
* ``check.py``: one call checked (forward/backward smoke test, per-input projected comparison,
  ``torch.autograd.gradcheck`` / ``gradgradcheck`` on small sub-problems);
* ``returns.py``: torch's errors about returned gradients, classified (no torch);
* ``single.py``: the driver of ``torchdoctor gradcheck FILE.py:Name --shape ...``.

See docs/gradcheck.md.
"""
