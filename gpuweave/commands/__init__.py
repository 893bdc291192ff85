"""One module per ``gpuweave`` sub-command; each exposes ``register(subparsers)``."""
