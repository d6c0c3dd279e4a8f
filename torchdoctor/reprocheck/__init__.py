"""`torchdoctor repro`: runs of the same script compared (reproducibility, exact resume)."""
