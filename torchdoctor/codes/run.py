"""Codes about the run itself (any script probe) and torchdoctor's own failures."""

from torchdoctor.codes import declare
from torchdoctor.skills import DEBUGGING

declare("internal-error", DEBUGGING, "warning",
        "a torchdoctor probe or rule failed; the rest of the report still stands")
declare("script-crashed", DEBUGGING, "error",
        "the script raised: exception, message, the last frame in user code")
declare("script-hung", DEBUGGING, "error",
        "no progress until the timeout: every thread's stack, the user frame it waited in")
declare("killed-by-signal", DEBUGGING, "error",
        "the script died by a signal (SIGKILL is often the host OOM killer)")
declare("no-training-steps", DEBUGGING, "warning",
        "no optimizer step or backward was seen, so step-based rules could not judge")
