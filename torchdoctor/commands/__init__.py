"""One module per command; each defines ``register(app)``. See torchdoctor/cli.py."""
