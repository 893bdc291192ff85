"""DRA nodes as API objects (no kubelet) for the tests that end at the allocation and binding.

A node gets its Node object (labels, a taint only the test's pods tolerate, Ready status with
capacity) and the agent's own ResourceSlices for its simulated hardware (``dradriver.slices``,
from the inventory the simulated NVML discovery gives, so fabric attributes such as the clique
come from the fabric answer). ``DraCleanup`` removes what a test module made.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfile
from dradriver.slices import pool_slices
from hardware.simulated.backend import SimulatedBackend
from tests.e2e.cluster import ControlPlane
from tests.support.pods import pod_body


def create_dra_node(
    plane: ControlPlane, name: str, profile: NodeProfile, *, label: str, taint: dict[str, str]
) -> NodeInventory:
    """The Node (labelled ``label: "true"``, tainted) and the pool its agent would publish."""
    labels = {"kubernetes.io/hostname": name, label: "true"}
    plane.core.create_node({"metadata": {"name": name, "labels": labels}, "spec": {"taints": [taint]}})
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e DRA node"}
    plane.core.patch_node_status(
        name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
    )
    backend = SimulatedBackend(profile, node_name=name)
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    resource = client.ResourceV1Api(plane.api)
    for body in pool_slices(inventory):
        resource.create_resource_slice(body)
    return inventory


def claim_pod(
    name: str, claim: str, *, scheduler: str, selector: dict[str, str], taint: dict[str, str]
) -> Any:
    """A pod whose one container uses the ResourceClaim ``claim`` (as request ``gpus``)."""
    return pod_body(
        name,
        scheduler=scheduler,
        node_selector=selector,
        tolerations=[taint],
        claims={"gpus": claim},
        container="main",
        image="e2e/none",
    )


class DraCleanup:
    """Deletes a module's pods, claims and claim templates in ``namespace``, and its nodes' slices
    and Node objects; what is already gone is fine."""

    def __init__(self, plane: ControlPlane, namespace: str, nodes: Iterable[str]) -> None:
        self.plane = plane
        self.namespace = namespace
        self.nodes = list(nodes)

    def stop(self) -> None:
        resource = client.ResourceV1Api(self.plane.api)
        namespace = self.namespace
        for call in (
            lambda: self.plane.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0),
            lambda: resource.delete_collection_namespaced_resource_claim(namespace),
            lambda: resource.delete_collection_namespaced_resource_claim_template(namespace),
            *(
                (lambda n=n: resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={n}"))
                for n in self.nodes
            ),
            *((lambda n=n: self.plane.core.delete_node(n)) for n in self.nodes),
        ):
            try:
                call()
            except ApiException as exc:
                if exc.status != 404:
                    raise
