"""Bounds and tolerances of the gradient check, in one place (no torch: rules import it).

Tolerances are torch.autograd.gradcheck's defaults, in float64: an element's analytical
gradient ``a`` and numerical gradient ``n`` (central difference, step ``EPS``) disagree when
``|a - n| > ATOL + RTOL * |n|``. A disagreement counts only if it is still there with the larger
step ``EPS_CONFIRM * max(1, |x|)`` (rounding noise of a forward that computes in lower precision
shrinks with a larger step, a wrong formula does not) and the point is not a kink (left and right
one-sided differences agree).
"""

EPS = 1e-6  # central-difference step (torch.autograd.gradcheck's default)
ATOL = 1e-5  # absolute tolerance (gradcheck's default)
RTOL = 1e-3  # relative tolerance (gradcheck's default)
EPS_CONFIRM = 1e-3  # second, larger step that must confirm a disagreement

SAMPLES_PER_FUNCTION = 3  # real calls kept per Function (distinct input shapes preferred)
CALL_BYTES = 16 * 2**20  # at most this many bytes copied from one call (larger: leading-dim slice)
TOTAL_BYTES = 128 * 2**20  # at most this many bytes of copies held in all
SUB_ELEMENTS = 128  # the sub-problem: rows of the leading dim sliced so an input has <= this many
LOCATE_ELEMENTS = 128  # elements of an input compared one by one (sampled when more)
SLOW_ELEMENTS = 128  # torch.autograd.gradcheck (full Jacobian) when every input has <= this many
SLOW_OUTPUTS = 1024  # ... and the outputs <= this many elements
GRADGRAD_ELEMENTS = 64  # gradgradcheck when inputs and outputs have <= this many elements in all
CHECK_BUDGET_S = 60.0  # wall-clock seconds for all checks after the run (default of --budget)
DIRTY_WATCH_CALLS = 1000  # calls of one Function watched for in-place inputs / ctx tensors
