"""``torchdoctor compare BEFORE.json AFTER.json``: did the change help?

Three parts, kept apart as everywhere else: :mod:`.load` reads two saved reports (bad input is
exit 2), :mod:`.judge` turns them into one comparison (pure: dicts in, a dict out — each delta
with its noise band, taken from the per-step series the reports carry, and a verdict), and
:mod:`.render` shows it (terminal, JSON, HTML with before/after plots).
"""
