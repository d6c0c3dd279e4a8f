"""torchdoctor: a command-line doctor for PyTorch training.

Diagnosis before solutions: route the symptom, measure the run, report findings.
Nothing heavy is imported here: `torchdoctor --help` and `ask` must stay fast.
"""

__version__ = "0.1.0"
