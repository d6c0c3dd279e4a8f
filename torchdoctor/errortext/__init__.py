"""One knowledge base of error texts, read by ``ask`` and by the rules that judge a run's errors.

- ``table``    the rows (data): id, skill, finding code, key, pattern, number extractor, groups
- ``match``    the matcher: which rows a text matches (key first, then the row's regex)
- ``numbers``  the number extractors a row names (bytes of an OOM, devices, ranks, shapes)

Nothing here imports torch, or anything outside the standard library but ``torchdoctor.skills``.
"""
