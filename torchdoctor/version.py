"""torchdoctor's version: one place, imported by the report, the CLI and the API without the package's
``__init__`` (which resolves the Python API lazily)."""

__version__ = "0.1.0"
