"""The child side of compared runs (the trials layer): the treatments ``treat`` applies, and the trial
trace (per-step loss, peak memory) every compared run records."""
