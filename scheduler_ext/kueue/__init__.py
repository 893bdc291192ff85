"""Kueue integration: the ``gpuweave.io/gpu-health`` admission check (docs/extender.md, Kueue)."""
