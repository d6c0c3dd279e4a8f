"""Codes about the run itself (any script probe) and torchdoctor's own failures."""

from torchdoctor.codes import declare
from torchdoctor.skills import DEBUGGING

declare("internal-error", DEBUGGING, "warning",
        "a torchdoctor probe or rule failed; the rest of the report still stands")
