"""DRA against the real Kubernetes components (1.37): the ResourceSlices `gpuweave publish --dra`
prints and the agent publishes, the DeviceClasses and RBAC of manifests/dra/, the example claims;
then pods with claims end to end: kube-scheduler's DynamicResources plugin allocates, the
ResourceClaim controller creates the claims from templates, the kubelet's DRA manager in
`harness node` prepares them through `gpuweave node-agent --dra` (CDI), and the device taint
eviction controller evicts the pod of a GPU that failed.

What the API server keeps is read back: a field behind a feature gate that is off is dropped on
write without an error, so "accepted" means the taints, shared counters and counter consumption
are still there.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from devicemodel.inventory import NodeInventory
from dradriver.devices import MigPublishing
from dradriver.slices import pool_slices
from dradriver.taint import Taint
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    SimNode,
    harness_binary,
    render_scheduler_config,
    start_controllers,
    start_scheduler,
    stopping,
    wait_for,
)
from tests.e2e.conftest import add_taint
from tests.e2e.test_e2e_cdi import paths, resolve

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
    from dradriver.kube import SlicePublisher  # noqa: PLC0415 (the kubernetes client, e2e only)

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
    lists = publisher.listed
    assert publisher.publish_once(relist=False) is False  # a health round: compared, no LIST
    assert publisher.listed == lists
    resource = client.ResourceV1Api(dra_plane.api)
    resource.delete_resource_slice(second[0]["metadata"]["name"])  # as the kubelet's wipe does
    mode["mig"] = MigPublishing.DYNAMIC  # the next write replaces a slice that is gone: created
    assert publisher.publish_once(relist=False) is True and publisher.listed == lists
    third = publisher.current()
    assert len(third) == 5 and {s["spec"]["pool"]["generation"] for s in third} == {3}
    resource.delete_resource_slice(third[0]["metadata"]["name"])
    assert publisher.publish_once(relist=False) is False  # unseen without a LIST ...
    assert publisher.publish_once(relist=True) is True  # ... the resync puts it back
    assert len(publisher.current()) == 5
    publisher.delete_all()
    assert publisher.current() == []


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_dra_slice_publisher_lists_on_time_however_often_health_wakes_it(dra_plane: ControlPlane) -> None:
    """The periodic LIST is counted by the clock: health rounds wake the publisher every second
    (``changed()``), which must not postpone it, or a pool the kubelet wiped stays gone; and a
    registration (``resync()``) lists now and once more a few seconds later, since the kubelet's
    start-up wipe runs in the background and can land after the first."""
    from dradriver.kube import AFTER_REGISTRATION_S, SlicePublisher  # noqa: PLC0415

    inventory = _inventory("dgx-h100", "e2e-dra-publisher-clock")
    clock = _Clock()
    publisher = SlicePublisher(
        dra_plane.api,
        node=inventory.name,
        build=lambda generation, _published: pool_slices(
            inventory, mig=MigPublishing.STATIC, generation=generation
        ),
        resync_s=30,
        clock=clock,
    )
    publisher.start()
    try:
        wait_for("the first pool published", lambda: publisher.published == 1)
        resource = client.ResourceV1Api(dra_plane.api)
        (only,) = publisher.current()
        resource.delete_resource_slice(only["metadata"]["name"])  # as the kubelet's wipe does
        clock.now = 31.0  # past the periodic LIST; a health round wakes the publisher
        publisher.changed()
        wait_for("the wiped pool published again by the periodic LIST", lambda: publisher.published == 2)
        listed = publisher.listed
        publisher.resync()
        wait_for("the LIST of a registration", lambda: publisher.listed == listed + 1)
        (again,) = publisher.current()
        resource.delete_resource_slice(again["metadata"]["name"])  # the wipe lands after that LIST
        clock.now += AFTER_REGISTRATION_S
        publisher.changed()
        wait_for("the pool published again by the second LIST", lambda: publisher.published == 3)
    finally:
        publisher.stop()
        publisher.delete_all()


# ---- DRA end to end: kube-scheduler's DynamicResources plugin, the ResourceClaim controller, the
# kubelet's DRA manager (harness node) and `gpuweave node-agent --dra` on one node ------------------

DRA_NODE = "e2e-dra-p5"
DRA_SCHEDULER = "e2e-dra-scheduler"
DRA_NAMESPACE = "e2e-dra-pods"
DRA_TAINT = {"key": "e2e.gpuweave.io/dra-tests", "value": "only", "effect": "NoSchedule"}
NVLINK_QUAD = ("gpu-4", "gpu-5", "gpu-6", "gpu-7")


def _split_nvlink_profile(work: Path) -> Path:
    """p5.48xlarge with its NVSwitch replaced by an NVLink quad on GPUs 4-7 and a pair on 0-1 (2
    and 3 have no NVLink): the first four GPUs in the pool span three domains, so a claim for four
    NVLink-connected GPUs is met only by the quad."""
    profile = yaml.safe_load((REPO / "hardware" / "builtin_profiles" / "p5.48xlarge.yaml").read_text())
    profile["metadata"]["name"] = "p5-split-nvlink"
    del profile["spec"]["nvswitch"]
    quad = [[a, b] for a in range(4, 8) for b in range(a + 1, 8)]
    profile["spec"]["nvlinks"] = [{"gpus": pair, "links": 6} for pair in [[0, 1], *quad]]
    path = work / "p5-split-nvlink.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _pool(plane: ControlPlane) -> dict[str, Any]:
    """This node's devices of driver gpuweave.io, by name, as the API server stores them."""
    found = client.ResourceV1Api(plane.api).list_resource_slice(field_selector=f"spec.nodeName={DRA_NODE}")
    return {d.name: d for s in found.items for d in s.spec.devices or []}


@pytest.fixture(scope="module")
def dra_cluster(
    dra_plane: ControlPlane, agent_kubeconfig: Path, scheduler_kubeconfig: Path
) -> Iterator[SimNode]:
    """One DRA node (harness node + `gpuweave node-agent --dra`), its own kube-scheduler (the
    gpuweave-scheduler's configuration without the extender, which DRA-only pods never call) and
    `harness controllers`; the node is tainted so only these tests' pods land there."""
    work = dra_plane.work
    health = work / "dra-health.yaml"
    health.write_text(yaml.safe_dump({"health": {"round_interval_s": 1, "startup_rounds": 1}}))
    node = SimNode(
        dra_plane,
        name=DRA_NODE,
        profile=str(_split_nvlink_profile(work)),
        agent_kubeconfig=agent_kubeconfig,
        health_config=health,
        agent_args=("--dra", "--dra-mig", "dynamic"),
    )
    config_path = render_scheduler_config(
        dra_plane, extender_url=None, kubeconfig=scheduler_kubeconfig, scheduler_name=DRA_SCHEDULER
    )
    scheduler = start_scheduler(dra_plane, config_path=config_path, name="kube-scheduler-dra")
    controllers = start_controllers(dra_plane)
    with stopping(_Forget(dra_plane), node, scheduler, controllers):
        wait_for(
            f"{DRA_NODE}'s ResourceSlices",
            lambda: node.agent.alive_and(lambda: bool(_pool(dra_plane))),
            timeout=90,
        )
        add_taint(dra_plane, DRA_NODE, DRA_TAINT)
        dra_plane.ensure_namespace(DRA_NAMESPACE)
        templates = yaml.safe_load_all((REPO / "manifests" / "dra" / "example-claims.yaml").read_text())
        dyn = dynamic.DynamicClient(dra_plane.api)  # type: ignore[no-untyped-call]
        for doc in [*templates, _one_gpu_template()]:
            ControlPlane.apply_one(dyn, {**doc, "metadata": {**doc["metadata"], "namespace": DRA_NAMESPACE}})
        yield node


class _Forget:
    """Stopped last: the DRA node's Node, inventory and ResourceSlices are deleted, as when a node
    leaves (no garbage collector runs here), so later modules of the session do not see it."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def stop(self) -> None:
        self.plane.forget_node(DRA_NODE)


def _one_gpu_template() -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuweave.io"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _claim_pod(name: str, template: str, *, grace_s: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": DRA_SCHEDULER,
            "terminationGracePeriodSeconds": grace_s,
            "nodeSelector": {"kubernetes.io/hostname": DRA_NODE},
            "tolerations": [{**DRA_TAINT, "operator": "Equal"}],
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "e2e/none", "resources": {"claims": [{"name": "devices"}]}}
            ],
        },
    }


def _pod_or_none(plane: ControlPlane, name: str) -> Any:
    try:
        return plane.core.read_namespaced_pod(name, DRA_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _run_claim_pod(plane: ControlPlane, name: str, template: str) -> tuple[Any, dict[str, Any]]:
    """Create the pod; once the kubelet's DRA manager prepared its claim, the pod and what the
    harness recorded for its container (claimDevices, cdiDevices)."""
    plane.core.create_namespaced_pod(DRA_NAMESPACE, _claim_pod(name, template))

    def prepared() -> tuple[Any, dict[str, Any]] | None:
        pod = plane.core.read_namespaced_pod(name, DRA_NAMESPACE)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed: {pod.status.reason}: {pod.status.message}")
        allocation = plane.allocation_of(DRA_NAMESPACE, name)
        return (pod, allocation["containers"]["main"]) if allocation else None

    return wait_for(f"pod {name} running with its claim prepared", prepared, timeout=90)


def _claim_of(plane: ControlPlane, pod: Any) -> Any:
    """The ResourceClaim the ResourceClaim controller generated for the pod's only claim."""
    statuses = pod.status.resource_claim_statuses or []
    assert [s.name for s in statuses] == ["devices"], statuses
    return client.ResourceV1Api(plane.api).read_namespaced_resource_claim(
        statuses[0].resource_claim_name, DRA_NAMESPACE
    )


def _delete_and_wait_gone(plane: ControlPlane, *names: str) -> None:
    for name in names:
        if _pod_or_none(plane, name) is not None:
            plane.core.delete_namespaced_pod(name, DRA_NAMESPACE)
    for name in names:
        wait_for(f"pod {name} gone", partial(_gone, plane, name), timeout=60)


def _gone(plane: ControlPlane, name: str) -> bool:
    return _pod_or_none(plane, name) is None


def _claim_specs(node: SimNode) -> set[str]:
    """Claim UIDs that have a CDI spec in the agent's spec directory."""
    prefix = "gpuweave.io-claim_"
    return {p.stem.removeprefix(prefix) for p in (node.state_dir / "cdi").glob(f"{prefix}*.json")}


def test_dra_four_hopper_gpus_on_one_nvlink_domain_prepared_with_cdi(dra_cluster: SimNode) -> None:
    plane = dra_cluster.plane
    pod, got = _run_claim_pod(plane, "dra-four-nvlink", "four-hopper-nvlink")
    try:
        claim = _claim_of(plane, pod)
        results = claim.status.allocation.devices.results
        assert {(r.driver, r.pool) for r in results} == {("gpuweave.io", DRA_NODE)}
        assert sorted(r.device for r in results) == list(NVLINK_QUAD)  # gpu-0..3 span three domains
        pool = _pool(plane)
        domains = {pool[r.device].attributes["nvlinkDomain"].string for r in results}
        assert len(domains) == 1
        assert [r.uid for r in claim.status.reserved_for] == [pod.metadata.uid]
        # the kubelet's DRA manager got these devices and their CDI IDs from NodePrepareResources
        assert sorted(d["device"] for d in got["claimDevices"]) == list(NVLINK_QUAD)
        uid = claim.metadata.uid
        expected = sorted(f"gpuweave.io/claim={uid}-{d}" for d in NVLINK_QUAD)
        assert sorted(got["cdiDevices"]) == expected
        assert uid in _claim_specs(dra_cluster)
        status, report = resolve(
            dra_cluster.state_dir / "cdi", [{"devices": got["cdiDevices"], "annotations": {}}]
        )
        assert (status, report["specErrors"]) == (0, {}), report
        container = report["containers"][0]
        assert {f"/dev/nvidia{i}" for i in range(4, 8)} <= set(paths(container))
        visible = [e for e in container["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        gpu_uuids = {pool[d].attributes["uuid"].string for d in NVLINK_QUAD}
        assert len(visible) == 1 and set(visible[0].split("=", 1)[1].split(",")) == gpu_uuids
        # the kubelet's pod-resources API lists the claim with its devices
        listed = _pod_resources_claims(dra_cluster, "dra-four-nvlink")
        assert [(c["claim_name"], c["claim_namespace"]) for c in listed] == [
            (claim.metadata.name, DRA_NAMESPACE)
        ]
        assert sorted(r["device_name"] for r in listed[0]["claim_resources"]) == list(NVLINK_QUAD)
        assert {r["driver_name"] for r in listed[0]["claim_resources"]} == {"gpuweave.io"}
    finally:
        _delete_and_wait_gone(plane, "dra-four-nvlink")
    # unprepared at termination (spec removed); the ResourceClaim controller releases the claim
    wait_for("the claim's CDI spec removed", lambda: claim.metadata.uid not in _claim_specs(dra_cluster))
    wait_for("the generated claim released", lambda: _released(plane, claim.metadata.name))


def _pod_resources_claims(node: SimNode, pod: str) -> list[dict[str, Any]]:
    """The dynamic resources the kubelet's pod-resources List gives the pod's container."""
    socket = node.kubelet_dir / "pod-resources" / "kubelet.sock"
    out = subprocess.run(
        [str(harness_binary()), "podresources", str(socket)], check=True, capture_output=True, text=True
    ).stdout
    for entry in json.loads(out)["list"]["pod_resources"]:
        if (entry["name"], entry["namespace"]) == (pod, DRA_NAMESPACE):
            (container,) = entry["containers"]
            return list(container.get("dynamic_resources") or [])
    pytest.fail(f"pod-resources List has no pod {pod}")


def _released(plane: ControlPlane, name: str) -> bool:
    """The claim is deleted, or no longer reserved nor allocated. Deleting a generated claim whose
    pod is gone is the garbage collector's job (owner reference), which the harness does not run;
    the ResourceClaim controller removes the reservation and the allocation."""
    found = client.ResourceV1Api(plane.api).list_namespaced_resource_claim(DRA_NAMESPACE)
    claims: list[Any] = [c for c in found.items if c.metadata and c.metadata.name == name]
    return not claims or not (claims[0].status.reserved_for or claims[0].status.allocation)


def test_dra_gpu_and_efa_on_one_pcie_root(dra_cluster: SimNode) -> None:
    plane = dra_cluster.plane
    pod, got = _run_claim_pod(plane, "dra-gpu-efa", "gpu-with-efa")
    try:
        results = _claim_of(plane, pod).status.allocation.devices.results
        by_request = {r.request: r.device for r in results}
        assert set(by_request) == {"gpu", "efa"}
        pool = _pool(plane)
        root = "resource.kubernetes.io/pcieRoot"
        gpu, efa = pool[by_request["gpu"]], pool[by_request["efa"]]
        assert gpu.attributes["type"].string == "gpu"
        assert efa.attributes["type"].string == "efa"
        assert gpu.attributes[root].string == efa.attributes[root].string
        assert sorted(d["device"] for d in got["claimDevices"]) == sorted(by_request.values())
        status, report = resolve(
            dra_cluster.state_dir / "cdi", [{"devices": got["cdiDevices"], "annotations": {}}]
        )
        assert status == 0, report
        assert any("uverbs" in p for p in paths(report["containers"][0]))  # the EFA adapter's node
    finally:
        _delete_and_wait_gone(plane, "dra-gpu-efa")


def test_dra_mig_claim_gets_an_instance_made_at_prepare_and_removed_after_the_pod(
    dra_cluster: SimNode,
) -> None:
    plane = dra_cluster.plane
    pod, got = _run_claim_pod(plane, "dra-mig", "mig-20gb")
    claim = _claim_of(plane, pod)
    try:
        (result,) = claim.status.allocation.devices.results
        placement = result.device  # a partitionable placement, e.g. gpu-0-mig-3g-40gb-4
        assert "-mig-" in placement and [d["device"] for d in got["claimDevices"]] == [placement]
        uuid = wait_for(f"{placement}'s new instance in the slice", lambda: _mig_uuid(plane, placement))
        status, report = resolve(
            dra_cluster.state_dir / "cdi", [{"devices": got["cdiDevices"], "annotations": {}}]
        )
        assert status == 0, report
        container = report["containers"][0]
        assert any(p.startswith("/dev/nvidia-caps/") for p in paths(container))
        assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in container["env"]
    finally:
        _delete_and_wait_gone(plane, "dra-mig")
    wait_for(f"{placement}'s instance removed", lambda: _mig_uuid(plane, placement) is None, timeout=60)
    assert claim.metadata.uid not in _claim_specs(dra_cluster)


def _mig_uuid(plane: ControlPlane, placement: str) -> str | None:
    """The MIG instance's UUID the slice lists for a placement; None while it has none."""
    attribute = (_pool(plane)[placement].attributes or {}).get("uuid")
    value = attribute.string if attribute is not None else ""
    return value if value and value.startswith("MIG-") else None


def test_dra_agent_restart_keeps_prepared_claims(dra_cluster: SimNode) -> None:
    plane = dra_cluster.plane
    pod, got = _run_claim_pod(plane, "dra-before-restart", "one-gpu")
    uid = _claim_of(plane, pod).metadata.uid
    try:
        dra_cluster.restart_agent()
        registration = dra_cluster.kubelet_dir / "plugins_registry" / "gpuweave.io-reg.sock"
        wait_for(
            "the restarted agent's registration", lambda: dra_cluster.agent.alive_and(registration.exists)
        )
        # the running pod keeps its claim: still Running, still reserved, its spec still there
        assert _pod_or_none(plane, "dra-before-restart").status.phase == "Running"
        assert uid in _claim_specs(dra_cluster)
        # the restarted agent prepares a new claim on another GPU, and unprepares the old one
        _, after = _run_claim_pod(plane, "dra-after-restart", "one-gpu")
        assert {d["device"] for d in after["claimDevices"]}.isdisjoint(
            {d["device"] for d in got["claimDevices"]}
        )
        _delete_and_wait_gone(plane, "dra-before-restart")
        assert uid not in _claim_specs(dra_cluster)
    finally:
        _delete_and_wait_gone(plane, "dra-before-restart", "dra-after-restart")


def test_dra_kubelet_restart_keeps_prepared_claims_and_the_pool_comes_back(dra_cluster: SimNode) -> None:
    """The restarted kubelet side reads its DRA manager checkpoint (the running pod is re-admitted
    without a new NodePrepareResources) and, as the kubelet does at start, deletes the node's
    ResourceSlices; the agent, registered again by the plugin watcher, publishes its pool again."""
    plane = dra_cluster.plane
    pod, got = _run_claim_pod(plane, "dra-kubelet-restart", "one-gpu")
    uid = _claim_of(plane, pod).metadata.uid
    before = set(_pool(plane))
    slice_uids = _slice_uids(plane)
    try:
        dra_cluster.restart_kubelet()

        def republished() -> bool:
            uids = _slice_uids(plane)
            return bool(uids) and not uids & slice_uids and set(_pool(plane)) == before

        wait_for("the pool wiped and published again", republished, timeout=60)
        again = plane.allocation_of(DRA_NAMESPACE, "dra-kubelet-restart")
        assert again is not None and again["containers"]["main"] == got
        assert _pod_or_none(plane, "dra-kubelet-restart").status.phase == "Running"
        assert uid in _claim_specs(dra_cluster)
        _, after = _run_claim_pod(plane, "dra-after-kubelet-restart", "one-gpu")
        assert after["cdiDevices"]
    finally:
        _delete_and_wait_gone(plane, "dra-kubelet-restart", "dra-after-kubelet-restart")
    assert uid not in _claim_specs(dra_cluster)


def _slice_uids(plane: ControlPlane) -> set[str]:
    found = client.ResourceV1Api(plane.api).list_resource_slice(field_selector=f"spec.nodeName={DRA_NODE}")
    return {s.metadata.uid for s in found.items}


def test_dra_xid_79_taints_the_device_and_evicts_only_its_pod(dra_cluster: SimNode) -> None:
    plane = dra_cluster.plane
    victim, victim_got = _run_claim_pod(plane, "dra-xid-victim", "one-gpu")
    _, bystander_got = _run_claim_pod(plane, "dra-xid-bystander", "one-gpu")
    try:
        (device,) = [d["device"] for d in victim_got["claimDevices"]]
        (other,) = [d["device"] for d in bystander_got["claimDevices"]]
        index = int(_pool(plane)[device].attributes["index"].int)
        victim_claim = _claim_of(plane, victim).metadata.uid
        dra_cluster.inject("--gpu", str(index), "--xid", "79")

        def no_execute() -> bool:
            return any(t.effect == "NoExecute" for t in _pool(plane)[device].taints or [])

        wait_for(f"a NoExecute taint on {device}", no_execute, timeout=60)
        assert not _pool(plane)[other].taints
        # the device taint eviction controller deletes the pod; the node unprepares its claim
        wait_for("the victim pod evicted", lambda: _pod_or_none(plane, "dra-xid-victim") is None, timeout=60)
        events = plane.core.list_namespaced_event(
            DRA_NAMESPACE, field_selector="involvedObject.name=dra-xid-victim"
        )
        assert "DeviceTaintManagerEviction" in {e.reason for e in events.items}  # by the controller
        wait_for("the victim's claim unprepared", lambda: victim_claim not in _claim_specs(dra_cluster))
        bystander = _pod_or_none(plane, "dra-xid-bystander")
        assert bystander is not None and bystander.status.phase == "Running"
        assert bystander.metadata.deletion_timestamp is None
        assert _claim_of(plane, bystander).metadata.uid in _claim_specs(dra_cluster)
    finally:
        _delete_and_wait_gone(plane, "dra-xid-victim", "dra-xid-bystander")
