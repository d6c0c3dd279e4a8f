"""``repro``'s child side: step and op fingerprints of what a step saw and made, the global RNGs drawn
from, seeding calls, and deterministic mode for one trial."""
