"""mig package of gpuweave."""
