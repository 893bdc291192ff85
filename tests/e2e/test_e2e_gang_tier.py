"""A gang that requires one NVLink clique, through the real kube-scheduler: placed inside one
clique, kept waiting where only a cross-clique placement exists, and re-placed in the other clique
after a tray fault.

Eighteen GB200 compute trays (Node objects with their status and GpuNodeInventory objects, no
kubelet: bound pods stay Pending, which is all scheduling needs) in two NVLink cliques of nine,
labelled as the node agent labels them (``nvidia.com/gpu.clique: <cluster UUID>.<clique ID>``,
from each tray's fabric). Clique A is fragmented: two of its trays hold a 1-GPU pod, so seven
whole trays are free there, nine in clique B. An 8-member gang of 4-GPU pods with
``gpuweave.io/gang-tier: nvidia.com/gpu.clique`` goes to clique B. Each member also asks for the
tray's IMEX channel (``gpuweave.io/imex-channel``, one per tray, counted by kube-scheduler): every
member's assignment names one IMEX domain listing the gang's eight trays.

Then a tray fault: two of the gang's trays publish their GPUs unhealthy (the node agent's
``GpuNodeInventory`` status), and the gang's pods are deleted and created again (health
remediation and the job controller). Clique B now holds seven members and clique A seven, so
only a placement across the cliques exists: the gang waits, with a reason naming the required
tier and the most one domain holds. Once clique A's 1-GPU pods are gone, the gang is placed
entirely inside clique A, with an IMEX domain of the same name listing its new trays.

A second kube-scheduler (profile ``gpuweave-tier-scheduler``) calls its own
``gpuweave extender --gang-ttl 15``, beside the session's scheduler; the trays carry a taint only
these pods tolerate.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_IMEX_CHANNEL
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE, ANNOTATION_GANG_TIER
from devicemodel.inventory import NodeInventory
from gpuweave.simulate.cluster_objects import profile_inventory
from nodeagent.published import node_labels
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.gpu_nodes import create_gpu_node, held_devices, publish_inventory
from tests.e2e.pods import GPU, scheduling_failure
from tests.support.pods import pod_body
from topology.network import LABEL_GPU_CLIQUE

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-gang-tier"
SCHEDULER = "gpuweave-tier-scheduler"
PROFILE = "gb200-compute-tray"
TRAYS_PER_CLIQUE = 9
CLIQUE_IDS = {"a": 1, "b": 2}
TRAYS = {f"gb200-{c}{i}": c for c in CLIQUE_IDS for i in range(TRAYS_PER_CLIQUE)}
FRAGMENTED = ("gb200-a0", "gb200-a1")  # clique A's trays that hold a 1-GPU pod
GANG_SIZE = 8
NODE_LABEL = "e2e.gpuweave.io/gang-tier-node"
TAINT = {"key": "e2e.gpuweave.io/gang-tier-tests", "value": "only", "effect": "NoSchedule"}
XID_79 = "Xid 79: GPU has fallen off the bus"


@dataclass
class Rack:
    """The trays' inventories, the tier scheduler and its extender."""

    inventories: dict[str, NodeInventory]
    extender: Process
    url: str
    scheduler: Process

    def clique_of(self, node: str) -> str:
        fabric = self.inventories[node].nvswitch
        assert fabric is not None and fabric.clique is not None
        return fabric.clique

    def free_gpus(self) -> float:
        """The extender's idle GB200 capacity in GPUs (healthy, unheld), from its metrics."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        found = re.search(
            r'^gpuweave_extender_free_gpus\{[^}]*product="NVIDIA GB200"[^}]*\} (\S+)$', text, re.M
        )
        return float(found.group(1)) if found else -1.0


def _tray(name: str) -> NodeInventory:
    """The tray's inventory, its fabric in its clique (the rack's NVLink partition)."""
    inventory = profile_inventory(PROFILE, name)
    fabric = inventory.nvswitch
    assert fabric is not None
    return replace(inventory, nvswitch=replace(fabric, clique_id=CLIQUE_IDS[TRAYS[name]]))


def _create_tray(plane: ControlPlane, inventory: NodeInventory) -> None:
    labels = {**node_labels(inventory), "kubernetes.io/hostname": inventory.name, NODE_LABEL: "true"}
    resources = {"cpu": "144", "memory": "960Gi", "pods": "110", GPU: "4", RESOURCE_IMEX_CHANNEL: "1"}
    create_gpu_node(
        plane, inventory, labels=labels, taint=TAINT, resources=resources, message="e2e GB200 tray"
    )


def _pod(name: str, *, gpus: int = 4, gang: str | None = None) -> dict[str, Any]:
    annotations = (
        {ANNOTATION_GANG: gang, ANNOTATION_GANG_SIZE: str(GANG_SIZE), ANNOTATION_GANG_TIER: LABEL_GPU_CLIQUE}
        if gang
        else {}
    )
    limits = {GPU: str(gpus), RESOURCE_IMEX_CHANNEL: "1"} if gang else {GPU: str(gpus)}
    return pod_body(
        name,
        scheduler=SCHEDULER,
        grace_s=0,
        tolerations=[TAINT],
        node_selector={NODE_LABEL: "true"},
        limits=limits,
        annotations=annotations,
        container="main",
        image="e2e/none",
    )


def _bound_one_gpu_pod(name: str, inventory: NodeInventory) -> dict[str, Any]:
    """A 1-GPU pod already bound to the tray, its GPU recorded as the extender records it."""
    held = PodAssignment(
        node=inventory.name, containers={"main": ContainerAssignment(devices={GPU: [inventory.gpus[0].uuid]})}
    )
    pod = _pod(name, gpus=1)
    pod["metadata"]["annotations"] = {ANNOTATION_ASSIGNMENT: held.to_annotation()}
    pod["spec"]["nodeName"] = inventory.name
    return pod


@pytest.fixture(scope="module")
def rack(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[Rack]:
    plane.ensure_namespace(NAMESPACE)
    inventories = {name: _tray(name) for name in TRAYS}
    extender: Process | None = None
    scheduler: Process | None = None
    try:
        for inventory in inventories.values():
            _create_tray(plane, inventory)
        extender, url = start_extender(
            plane, kubeconfig=scheduler_kubeconfig, extra_args=("--gang-ttl", "15"), name="tier-extender"
        )
        config = render_scheduler_config(
            plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER
        )
        scheduler = start_scheduler(plane, config_path=config, name="tier-kube-scheduler")
        yield Rack(inventories, extender, url, scheduler)
    finally:
        for process in (scheduler, extender):
            if process is not None:
                process.stop()
        _delete_pods(plane, [p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items])
        for name in TRAYS:
            plane.forget_node(name)


def _delete_pods(plane: ControlPlane, names: list[str]) -> None:
    for name in names:
        try:
            plane.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(
        "pods to be deleted",
        lambda: not {p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items} & set(names),
    )


def _bound(plane: ControlPlane, names: list[str]) -> dict[str, str]:
    pods = {p.metadata.name: p for p in plane.core.list_namespaced_pod(NAMESPACE).items}
    return {n: pods[n].spec.node_name for n in names if n in pods and pods[n].spec.node_name}


def _wait_all_bound(plane: ControlPlane, rack: Rack, names: list[str]) -> dict[str, str]:
    def done() -> dict[str, str] | None:
        rack.scheduler.check_alive()
        bound = _bound(plane, names)
        return bound if len(bound) == len(names) else None

    return wait_for(f"{len(names)} pods bound", done)


def _held_devices(plane: ControlPlane) -> dict[str, list[str]]:
    return held_devices(plane, NAMESPACE)


def _imex_domains(plane: ControlPlane, names: list[str]) -> set[tuple[str, tuple[str, ...]]]:
    """The IMEX domains (name, nodes) the members' assignments name."""
    found = set()
    for pod in plane.core.list_namespaced_pod(NAMESPACE).items:
        if pod.metadata.name in names:
            imex = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT]).imex
            assert imex is not None, pod.metadata.name
            found.add((imex.name, imex.nodes))
    return found


def test_a_clique_gang_stays_in_one_clique_and_moves_whole_after_a_tray_fault(
    plane: ControlPlane, rack: Rack
) -> None:
    fillers = [f"one-gpu-{node}" for node in FRAGMENTED]
    for name, node in zip(fillers, FRAGMENTED, strict=True):
        plane.core.create_namespaced_pod(NAMESPACE, _bound_one_gpu_pod(name, rack.inventories[node]))
    wait_for("the extender to count the 1-GPU pods", lambda: rack.free_gpus() == 4 * len(TRAYS) - 2)

    # 1. clique A holds 7 whole trays, clique B 9: the gang goes to B
    members = [f"train-{i}" for i in range(GANG_SIZE)]
    started = time.monotonic()
    for name in members:
        plane.core.create_namespaced_pod(NAMESPACE, _pod(name, gang="train"))
    placed = _wait_all_bound(plane, rack, members)
    first_s = time.monotonic() - started
    print(f"gang placed on {sorted(placed.values())} in {first_s:.1f} s")
    clique_b = rack.clique_of("gb200-b0")
    assert {rack.clique_of(n) for n in placed.values()} == {clique_b}
    assert len(set(placed.values())) == GANG_SIZE  # one 4-GPU member per tray
    assert all(len(pods) == 1 for pods in _held_devices(plane).values())
    ((domain, imex_nodes),) = _imex_domains(plane, members)  # one domain: the gang's eight trays
    assert imex_nodes == tuple(sorted(placed.values()))

    # 2. a tray fault under two members; remediation evicts the gang and its job re-creates it
    faulty = sorted(placed.values())[:2]
    for node in faulty:
        inventory = rack.inventories[node]
        publish_inventory(plane, inventory, faults=dict.fromkeys((g.uuid for g in inventory.gpus), XID_79))
    _delete_pods(plane, members)
    wait_for(
        "the extender to see the faulty trays and the gang gone",
        lambda: rack.free_gpus() == 4 * len(TRAYS) - 2 - 4 * len(faulty),
    )
    again = [f"train-again-{i}" for i in range(GANG_SIZE)]
    for name in again:
        plane.core.create_namespaced_pod(NAMESPACE, _pod(name, gang="train"))
    waiting = (
        f"gang {NAMESPACE}/gang:train needs 8 more member(s) placed together inside one "
        "nvidia.com/gpu.clique domain (its gpuweave.io/gang-tier), all or none"
    )

    def failures() -> dict[str, str | None]:
        return {name: scheduling_failure(plane, NAMESPACE, name) for name in again}

    def waits_for_a_clique() -> tuple[str, str] | None:
        """A member's failure once the extender knows all eight members. One filtered before
        that is refused with the count, and where two attempts got the same count kube-scheduler
        writes no new condition, so nothing requeues it until the next cluster event: the
        members attempted last carry the gang's reason."""
        found = [(name, m) for name, m in failures().items() if m and waiting in m]
        return found[0] if found else None

    member, message = wait_for(
        "the gang to wait for a clique", waits_for_a_clique, seen=lambda: repr(failures())
    )
    print(f"{member}: {message}")
    assert "the most any network domain holds is 7 (nvidia.com/gpu.clique=" in message
    assert not _bound(plane, again)  # 7 + 7 whole trays exist, but in two cliques

    # 3. clique A frees: the whole gang goes there
    started = time.monotonic()
    _delete_pods(plane, fillers)
    moved = _wait_all_bound(plane, rack, again)
    second_s = time.monotonic() - started
    print(f"gang re-placed on {sorted(moved.values())} {second_s:.1f} s after clique A freed")
    assert {rack.clique_of(n) for n in moved.values()} == {rack.clique_of("gb200-a0")}
    assert len(set(moved.values())) == GANG_SIZE
    assert all(len(pods) == 1 for pods in _held_devices(plane).values())
    assert _imex_domains(plane, again) == {(domain, tuple(sorted(moved.values())))}  # same job, new trays
