"""A broken node is handed to Karpenter and replaced, with the real Karpenter controllers.

Two p5.48xlarge nodes come from Karpenter (kwok provider) for a running 2 x 8-GPU training gang
(an Indexed Job, gang annotations); then GPU 3 of one node falls off the bus (Xid 79) and its
reset fails. The node agent evicts the gang (its grace period: time to checkpoint), tries the
reset, and says only a reboot helps (``GpuweaveNodeServiceable=False RebootRequired``). With no
reboot path, ``gpuweave lifecycle`` hands the node to Karpenter: it deletes the node's NodeClaim
(Karpenter drains and terminates the node), sets ``AcceleratedHardwareReady=False`` and lists the
failed GPU in ``GpuBadHardware``. Karpenter brings a new node, whose agent runs its start-up
checks, and the Job's re-created gang runs again on the survivor and the new node. Each phase is
timed (docs/node-lifecycle.md has the figures).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devicemodel.contracts import (
    ANNOTATION_REPLACEMENT,
    CONDITION_ACCELERATED_HARDWARE_READY,
    CONDITION_NODE_SERVICEABLE,
)
from tests.e2e import karpenter as kp
from tests.e2e.cluster import wait_for
from tests.e2e.lifecycle_cluster import (
    NAMESPACE,
    POOL_TAINT,
    STARTUP_TAINT,
    Clock,
    LifecycleCluster,
    node_condition,
    read_node,
)

pytestmark = pytest.mark.e2e

POOL = "e2e-training"
GANG = {"gpuweave.io/gang": "train", "gpuweave.io/gang-size": "2"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LifecycleCluster]:
    pool = kp.node_pool(
        POOL,
        labels={"gpuweave.io/gpu-node": "true"},
        taints=[POOL_TAINT],
        startup_taints=[STARTUP_TAINT],
        instance_types=["p5.48xlarge"],
    )
    started = LifecycleCluster(tmp_path_factory.mktemp("lifecycle"), pools=[pool], lifecycle_args=())
    try:
        yield started
    finally:
        started.stop()


def _claim_of(cluster: LifecycleCluster, node: str) -> dict[str, Any] | None:
    for claim in kp.nodeclaims(cluster.plane):
        if (claim.get("status") or {}).get("nodeName") == node:
            return claim
    return None


class ReplacementWatch:
    """Polls the cluster after the fault and marks each phase the first time it is seen."""

    def __init__(self, cluster: LifecycleCluster, *, broken: str, gang: list[Any], claim: str) -> None:
        self.cluster, self.plane, self.broken, self.claim = cluster, cluster.plane, broken, claim
        self.first_nodes = {p.spec.node_name for p in gang}
        self.first_uids = {p.metadata.uid for p in gang}
        self.first_claims = {c["metadata"]["name"] for c in kp.nodeclaims(cluster.plane)}
        self.clock = Clock()
        self.seen: dict[str, Any] = {}

    def __call__(self) -> bool:
        self.cluster.check()
        node = read_node(self.plane, self.broken)
        self._node(node)
        self._pods()
        self._engine(node)
        pods = self.cluster.job_pods("train")
        placed = {p.spec.node_name for p in pods if p.spec.node_name}
        if len(pods) == 2 and len(placed) == 2 and self.broken not in placed:
            self.clock.mark("gang bound")
            if self.cluster.running(pods):
                self.clock.mark("gang running again")
                return node is None
        return False

    def _node(self, node: Any | None) -> None:
        if node is None:
            self.clock.mark("broken node drained and gone")
            return
        if (node.status.allocatable or {}).get("nvidia.com/gpu") == "7":
            self.clock.mark("detected: GPU withheld (allocatable 8 -> 7)")
        verdict = node_condition(node, CONDITION_NODE_SERVICEABLE)
        if verdict is not None and verdict.status == "False":
            self.clock.mark(f"verdict {verdict.reason}")
        if ANNOTATION_REPLACEMENT in (node.metadata.annotations or {}):
            self.seen["handover"] = json.loads(node.metadata.annotations[ANNOTATION_REPLACEMENT])
        repair = node_condition(node, CONDITION_ACCELERATED_HARDWARE_READY)
        if repair is not None and repair.status == "False":
            self.seen["repair condition"] = repair.reason

    def _pods(self) -> None:
        every = self.plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=train").items
        old = [p for p in every if p.metadata.uid in self.first_uids]
        if any(p.metadata.deletion_timestamp for p in old) or len(old) < len(self.first_uids):
            self.clock.mark("gang evicted by the agent (grace period to checkpoint)")
        if not old:
            self.clock.mark("gang's pods terminated")
        if any(p.metadata.uid not in self.first_uids for p in every):
            self.clock.mark("Job re-created the gang's pods")

    def _engine(self, node: Any | None) -> None:
        claims = {c["metadata"]["name"]: c for c in kp.nodeclaims(self.plane)}
        mine = claims.get(self.claim)
        if mine is None or mine["metadata"].get("deletionTimestamp"):
            self.clock.mark("NodeClaim deleted (handed to Karpenter)")
        if set(claims) - self.first_claims:
            self.clock.mark("Karpenter launched a new NodeClaim")
        fresh = [n for n in kp.karpenter_nodes(self.plane) if n.metadata.name not in self.first_nodes]
        if fresh:
            self.seen.setdefault("new node", fresh[0].metadata.name)
            self.clock.mark("new node registered")
            taints = {t.key for t in fresh[0].spec.taints or []}
            if STARTUP_TAINT["key"] not in taints and "karpenter.sh/unregistered" not in taints:
                self.clock.mark("new node's start-up checks passed (taint lifted)")


def test_a_node_whose_gpu_cannot_be_reset_is_replaced_through_its_nodeclaim(
    cluster: LifecycleCluster,
) -> None:
    plane = cluster.plane
    cluster.create_job("train", members=2, limits={"nvidia.com/gpu": "8"}, annotations=GANG)
    before = cluster.wait_job_running("train", 2)
    broken, survivor = sorted(p.spec.node_name for p in before)
    assert broken != survivor
    claim = _claim_of(cluster, broken)
    assert claim is not None, f"no NodeClaim names {broken}"

    watch = ReplacementWatch(cluster, broken=broken, gang=before, claim=claim["metadata"]["name"])
    machine = cluster.machines.machine(broken)
    machine.inject("--gpu", "3", "--reset-fails")
    machine.inject("--gpu", "3", "--xid", "79")
    try:
        wait_for("the broken node replaced and the gang running again", watch, timeout=240, every=0.2)
    finally:
        print("\nnode replacement, seconds after the fault:", json.dumps(watch.clock.marks, indent=1))
        (plane.work / "replacement-phases.json").write_text(json.dumps(watch.clock.marks, indent=1))

    seen = watch.seen
    after = cluster.job_pods("train")
    assert sorted(p.spec.node_name for p in after) == sorted([survivor, seen["new node"]])
    assert claim["metadata"]["name"] not in {c["metadata"]["name"] for c in kp.nodeclaims(plane)}
    assert seen["handover"]["engine"] == "karpenter", seen
    assert seen["handover"]["verdict"] == "RebootRequired", seen
    assert seen["repair condition"] == "GpuweaveRebootRequired", seen
    bad: Any = client.CustomObjectsApi(plane.api).list_cluster_custom_object(
        "gpuweave.io", "v1alpha1", "gpubadhardwares"
    )
    assert broken in {item["spec"]["node"] for item in bad["items"]}
    events = plane.core.list_namespaced_event("default", field_selector=f"involvedObject.name={broken}").items
    assert "GpuweaveNodeHandedOver" in {e.reason for e in events}
