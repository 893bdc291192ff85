"""DRA objects against the real kube-apiserver (1.37): the ResourceSlices `gpuweave publish --dra`
prints and the agent publishes, the DeviceClasses and RBAC of manifests/dra/, the example claims.

What the API server keeps is read back: a field behind a feature gate that is off is dropped on
write without an error, so "accepted" means the taints, shared counters and counter consumption
are still there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, config, dynamic

from deviceplugin.dra.devices import MigPublishing
from deviceplugin.dra.slices import Taint, pool_slices
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from tests.e2e.cluster import REPO, ControlPlane
from topology.inventory import NodeInventory

pytestmark = pytest.mark.e2e


def _inventory(profile: str, node: str) -> NodeInventory:
    backend = SimulatedBackend(load_profile(profile), node_name=node)
    try:
        return backend.discover()
    finally:
        backend.close()


@pytest.fixture(scope="module")
def dra_plane(plane: ControlPlane) -> ControlPlane:
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    return plane


@pytest.fixture(scope="module")
def agent_dyn(dra_plane: ControlPlane) -> Iterator[dynamic.DynamicClient]:
    """The node agent's own service account (base RBAC plus manifests/dra's)."""
    path = dra_plane.service_account_kubeconfig("gpuweave-node-agent")
    api = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    try:
        yield dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    finally:
        api.close()


def _slices_api(dyn: dynamic.DynamicClient) -> Any:
    return dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")


def _devices(stored: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in stored for d in s["spec"].get("devices") or []}


def test_dra_device_classes_are_served(dra_plane: ControlPlane) -> None:
    classes = client.ResourceV1Api(dra_plane.api).list_device_class()
    names = {c.metadata.name for c in classes.items}
    assert {"gpu.gpuweave.io", "mig.gpuweave.io", "efa.gpuweave.io"} <= names


def _create_pool(dyn: dynamic.DynamicClient, slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    api = _slices_api(dyn)
    for item in slices:
        api.create(body=item)
    return [api.get(name=s["metadata"]["name"]).to_dict() for s in slices]


def test_dra_static_slices_with_taints_are_accepted_by_the_agent_identity(
    agent_dyn: dynamic.DynamicClient,
) -> None:
    inventory = _inventory("p5.48xlarge", "e2e-dra-p5")
    taints = {"gpu-3": (Taint("gpuweave.io/unhealthy", "failed", "NoExecute"),)}
    stored = _create_pool(agent_dyn, pool_slices(inventory, taints=taints))
    devices = _devices(stored)
    assert len(devices) == 8 + 32
    assert devices["gpu-3"]["taints"][0]["effect"] == "NoExecute"
    assert devices["gpu-3"]["taints"][0]["timeAdded"]  # stamped by the API server
    root = "resource.kubernetes.io/pcieRoot"
    efa_roots = {d["attributes"][root]["string"] for d in devices.values() if "efa" in d["name"]}
    assert devices["gpu-0"]["attributes"][root]["string"] in efa_roots


def test_dra_partitionable_mig_slices_keep_counters(agent_dyn: dynamic.DynamicClient) -> None:
    inventory = _inventory("dgx-h100", "e2e-dra-h100")
    stored = _create_pool(agent_dyn, pool_slices(inventory, mig=MigPublishing.DYNAMIC))
    counter_sets = [c for s in stored for c in s["spec"].get("sharedCounters") or []]
    assert len(counter_sets) == 8
    devices = _devices(stored)
    assert len(devices) == 8 * 26
    assert devices["gpu-5-mig-3g-40gb-4"]["consumesCounters"][0]["counterSet"] == "gpu-5-mig"
    assert devices["gpu-5"]["consumesCounters"][0]["counters"]["compute-slices"]["value"] == "7"


def test_dra_example_claims_are_valid(dra_plane: ControlPlane) -> None:
    dra_plane.ensure_namespace("e2e-dra-claims")
    dyn = dynamic.DynamicClient(dra_plane.api)  # type: ignore[no-untyped-call]
    docs = list(yaml.safe_load_all((REPO / "manifests" / "dra" / "example-claims.yaml").read_text()))
    assert len(docs) == 3
    for doc in docs:
        ControlPlane.apply_one(dyn, {**doc, "metadata": {**doc["metadata"], "namespace": "e2e-dra-claims"}})


def test_dra_slice_publisher_reconciles_the_pool(dra_plane: ControlPlane) -> None:
    """Created, left alone when unchanged, rewritten under the next generation when the pool shrinks
    (a dynamic-MIG pool becoming a static one), stale slices deleted, and removed on delete_all."""
    from deviceplugin.dra.kube import SlicePublisher  # noqa: PLC0415 (the kubernetes client, e2e only)

    inventory = _inventory("dgx-h100", "e2e-dra-publisher")
    mode = {"mig": MigPublishing.DYNAMIC}

    def build(generation: int, published: Any) -> list[dict[str, Any]]:
        return pool_slices(inventory, mig=mode["mig"], generation=generation)

    publisher = SlicePublisher(dra_plane.api, node=inventory.name, build=build)
    assert publisher.publish_once() is True
    first = publisher.current()
    assert len(first) == 5 and {s["spec"]["pool"]["generation"] for s in first} == {1}
    assert publisher.publish_once() is False  # nothing changed, nothing written
    mode["mig"] = MigPublishing.STATIC
    assert publisher.publish_once() is True
    second = publisher.current()
    assert len(second) == 1 and second[0]["spec"]["pool"] == {
        "name": inventory.name,
        "generation": 2,
        "resourceSliceCount": 1,
    }
    publisher.delete_all()
    assert publisher.current() == []
