"""The trials layer: the same script again under a variation, measured and compared.

Every probe that answers "what changes if…" runs the user's unmodified script more than once:
``treat`` (baseline vs a treatment), ``repro`` (run A vs run B, then a localising pair),
``compile`` (compiled vs eager), the resume check. They share one orchestration:

1. **spec** (:mod:`.spec`): a :class:`Variation` — a name, a human-readable setting, the child
   options that switch it on (read by an instrument in the child: ``ctx.options``), environment
   variables for the child, and the extra evidence kinds it needs armed;
2. **bounded run** (:mod:`.session`): :class:`Trials` runs the script under the variation with
   the same argv, bounded in steps and by the whole command's budget, output not echoed, one
   run dir each (under ``--out DIR/trials/`` or a temp dir removed at the end);
3. **evidence** (:class:`TrialRun`, :mod:`.run`; on N ranks :mod:`.ranked`, timed on the
   slowest rank): the run's Evidence with what every comparison reads —
   judged step times (warm-up left out, as ``metrics.steps``), the per-step loss and the peak
   memory (instrument ``trial_trace``), and a failure text when the run did not train;
4. **comparison** (:mod:`.compare`): medians, spread across rounds, speed-up and noise band,
   loss drift — pure functions, unit-tested on numbers.

Nothing here imports torch (the parent never does); variations are applied in the child.
"""

from torchdoctor.trials.compare import (loss_drift, median, noise_band, round_medians,  # noqa: F401
                                        speedup)
from torchdoctor.trials.session import TRIAL_NEEDS, TrialRun, Trials  # noqa: F401
from torchdoctor.trials.spec import BASELINE, Variation  # noqa: F401
