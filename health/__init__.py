"""health package of gpuweave."""
