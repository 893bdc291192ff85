"""The ``gpuweave status`` client: list the cluster's objects, rebuild the extender's view with the
extender's own code, and print per-GPU rows or one pod's decision (``--explain``).
"""
