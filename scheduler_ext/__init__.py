"""scheduler_ext package of gpuweave."""
