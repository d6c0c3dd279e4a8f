"""Small bundled training scripts for ``torchdoctor demo`` (each with a real, measurable problem)."""

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent


def path(name: str) -> Path:
    return EXAMPLES / name
