"""The API-server side of per-pod GPU use: publishing it, and evicting a pod over its share's memory.

- ``UsagePublisher`` writes the last round's rows (``PodUsageService.published``) as the node's
  ``GpuNodeInventory`` ``status.podUsage`` with a merge patch of that one field (the inventory
  publisher's patches leave it alone), when the rows changed and at most once every
  ``every_s`` seconds (default 60): use changes every round, and a write per round per node would
  load the API server for what ``/metrics`` already shows. ``gpuweave status`` reads it.
- ``KubeEvictor`` is ``usage_service.Evictor`` over health's Kubernetes side (the Eviction API,
  so PodDisruptionBudgets apply, and Events on the pod).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from devicemodel.contracts import API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL
from health.kube import KubeCluster
from health.remediation import PodRef

log = logging.getLogger(__name__)
PUBLISH_EVERY_S = 60.0


class UsagePublisher:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        node: str,
        rows: Callable[[], list[dict[str, Any]]],
        every_s: float = PUBLISH_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._node = node
        self._rows = rows
        self._every_s = every_s
        self._clock = clock
        self._last: list[dict[str, Any]] | None = None
        self._last_at = -float("inf")
        self.published = 0

    def changed(self) -> None:
        """After a usage round: publish when the rows differ and the last write is old enough."""
        rows = self._rows()
        now = self._clock()
        if rows == self._last or now - self._last_at < self._every_s:
            return
        try:
            self._custom.patch_cluster_custom_object_status(
                API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL, self._node, {"status": {"podUsage": rows}}
            )
        except Exception as exc:  # an API outage, or no inventory yet: the next round tries again
            log.debug("per-pod GPU use not published: %s", exc)
            return
        self._last, self._last_at = rows, now
        self.published += 1


class KubeEvictor:
    def __init__(self, cluster: KubeCluster) -> None:
        self._cluster = cluster

    def evict_pod(self, namespace: str, name: str, *, uid: str, grace_s: int) -> str:
        """The pod its processes' cgroup names, by UID: a pod re-created under the name is not it."""
        return self._cluster.evict(PodRef(namespace, name, frozenset(), uid=uid), grace_s=grace_s)

    def pod_event(self, namespace: str, name: str, *, reason: str, message: str) -> None:
        try:
            self._cluster.post_event(reason=reason, message=message, pod=PodRef(namespace, name, frozenset()))
        except Exception as exc:  # the eviction is what counts; a lost Event is logged
            log.warning("Event %s on %s/%s not posted: %s", reason, namespace, name, exc)
