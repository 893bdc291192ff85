"""Runtime MIG reshapes per GPU without reboots: the planner (pure), the journal written before any
NVML call, the reconciler, restore at start, declared layouts and demand mode, and the service the
node agent runs. MIG profile facts live in ``hardware.mig_catalog``.
"""
