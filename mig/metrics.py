"""Prometheus metrics of the MIG manager, in a registry the caller owns (no global state).

Counted where a layout is applied to one GPU (``MigReconciler.apply``: declared layouts, demand
mode, ``gpuweave mig apply`` and the ``mig.*`` control commands); a health remediation's
recreate of one instance is counted by health's remediation metrics instead.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

RESHAPE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class MigMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reshapes = Counter(
            "gpuweave_mig_reshapes",
            "MIG layout applies on one GPU, by outcome: changed (instances destroyed or created, or "
            "MIG mode switched), refused (the plan needs a busy instance or an idle GPU: nothing "
            "changed) or error (an NVML call, the busy-device check or verification failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.reshape_seconds = Histogram(
            "gpuweave_mig_reshape_seconds",
            "Time to apply a MIG layout that changed a GPU (plan, NVML calls, verification)",
            buckets=RESHAPE_BUCKETS,
            registry=self.registry,
        )
