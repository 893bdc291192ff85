"""hardware package of gpuweave."""
