"""The MIG manager's Kubernetes side: this node's declared layout and labels, and demand mode.

The node's ``gpuweave.io/mig-layout`` annotation is followed through a ``kubeio.listwatch``
watch of its own Node object (field selector ``metadata.name``): each new value goes straight to
the ``LayoutFollower``, which also reads the annotation every ``fallback_poll_s`` in case a
change was missed. The Node's labels are kept for demand mode, which matches pending pods' node
selectors against them (``mig/kube_demand.py``). Objects stay raw JSON, as kubeio hands them on.
The node agent's composition root imports this module only with an API server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import MIG_LAYOUT_ANNOTATION
from kubeio.errors import NOT_FOUND, status_of
from kubeio.listwatch import WATCH_TIMEOUT_S, ListWatch, metadata_only
from mig.kube_demand import DemandDriver
from mig.service import LayoutFollower, MigService

FALLBACK_POLL_S = 60.0  # the annotation is still read this often, in case the watch missed a change


def _layout_of(node: Mapping[str, Any]) -> str | None:
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(MIG_LAYOUT_ANNOTATION)
    return str(value) if value is not None else None


def node_annotation_reader(api: kube_client.ApiClient, node_name: str) -> Callable[[], str | None]:
    """Reads this node's ``gpuweave.io/mig-layout`` annotation through the API server."""
    core = kube_client.CoreV1Api(api)

    def read() -> str | None:
        try:
            response: Any = core.read_node(node_name, _preload_content=False)  # the raw body
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:  # no Node object (yet): nothing declared
                return None
            raise
        return _layout_of(orjson.loads(response.data))

    return read


class NodeWatch:
    """Watches this node's Node object for its labels and the declared layout; new layout values
    go straight to the follower, label changes to ``on_labels``."""

    def __init__(
        self,
        api: kube_client.ApiClient,
        node_name: str,
        *,
        follower: LayoutFollower,
        on_labels: Callable[[], None] = lambda: None,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._node = node_name
        self._follower = follower
        self._on_labels = on_labels
        self._labels: dict[str, str] = {}
        self._lock = threading.Lock()
        self.watch = ListWatch(
            kube_client.CoreV1Api(api).list_node,
            on_event=self._event,
            what=f"node {node_name}",
            timeout_s=timeout_s,
            remember=metadata_only,  # a deleted Node is ignored
            field_selector=f"metadata.name={node_name}",
        )

    def labels(self) -> dict[str, str]:
        with self._lock:
            return dict(self._labels)

    def start(self) -> None:
        self.watch.start()

    def stop(self) -> None:
        self.watch.stop()

    def _event(self, kind: str, node: Mapping[str, Any]) -> None:
        """A deleted Node declares nothing new: the layout applied stays until the Node returns."""
        metadata = node.get("metadata") or {}
        if kind == "DELETED" or metadata.get("name") != self._node:
            return
        labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
        with self._lock:
            changed, self._labels = labels != self._labels, labels
        self._follower.offer(_layout_of(node))
        if changed:
            self._on_labels()


class MigKube:
    """The API-server side of the MIG manager: layout follower + Node watch (+ demand mode)."""

    def __init__(
        self, follower: LayoutFollower, node_watch: NodeWatch, demand: DemandDriver | None = None
    ) -> None:
        self.follower = follower
        self.node_watch = node_watch
        self.demand = demand

    def stop(self) -> None:
        if self.demand is not None:
            self.demand.stop()
        self.node_watch.stop()
        self.follower.stop()


def start_mig_kube(
    api: kube_client.ApiClient,
    node_name: str,
    service: MigService,
    *,
    demand: bool = False,
    timeout_s: int = WATCH_TIMEOUT_S,
    fallback_poll_s: float = FALLBACK_POLL_S,
) -> MigKube:
    """Follow the declared layout through a Node watch (a read every ``fallback_poll_s`` as a
    fallback) and, with ``demand``, serve pending pods' MIG requests; stop it before the agent."""
    follower = LayoutFollower(node_annotation_reader(api, node_name), service, interval_s=fallback_poll_s)
    driver = DemandDriver(api, node_name, service, timeout_s=timeout_s) if demand else None
    node_watch = NodeWatch(
        api,
        node_name,
        follower=follower,
        on_labels=driver.wake if driver is not None else lambda: None,
        timeout_s=timeout_s,
    )
    follower.start()
    node_watch.start()
    if driver is not None:
        driver.start(labels=node_watch.labels)
    return MigKube(follower, node_watch, driver)
