"""Listeners gpuweave serves to clients it does not control, under one set of bounds (``gate``)."""
