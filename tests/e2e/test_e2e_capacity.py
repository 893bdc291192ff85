"""Capacity Karpenter cannot read, asked for with CapacityBuffers, with the real Karpenter controllers.

Three NodePools of p5.48xlarge machines (Karpenter's kwok provider; their instance type lists
only cpu, memory and ``nvidia.com/gpu``, as on AWS), each behind a taint only its tests'
pods tolerate: ``e2e-shares`` (the node agent offers every GPU as fractional shares),
``e2e-mig`` (every GPU in MIG mode with no instance, the agent in MIG demand mode) and
``e2e-gang`` (whole GPUs; machines in two network blocks). ``gpuweave lifecycle
--capacity-config`` turns pending pods that fit nowhere into CapacityBuffers Karpenter reads, and
withdraws them once the pods are placed; share nodes whose shares fit no other node get
``karpenter.sh/do-not-disrupt``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e import karpenter as kp
from tests.e2e.cluster import wait_for
from tests.e2e.lifecycle_cluster import BLOCKS, NAMESPACE, STARTUP_TAINT, LifecycleCluster
from tests.support.agent_process import remove_tree, short_temp_dir
from topology.network import LABEL_AWS_LAYER_3

pytestmark = pytest.mark.e2e

SHARES, MIG, GANG = "e2e-shares", "e2e-mig", "e2e-gang"
BUFFER_NAMESPACE = "gpuweave-system"


def _taint(pool: str) -> dict[str, str]:
    return {"key": "e2e.gpuweave.io/pool", "value": pool, "effect": "NoSchedule"}


def _tolerate(pool: str) -> list[dict[str, str]]:
    return [{"key": "e2e.gpuweave.io/pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LifecycleCluster]:
    work = tmp_path_factory.mktemp("capacity")
    config = work / "capacity.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpuweave.io/v1alpha1",
                "kind": "CapacityConfig",
                "namespace": BUFFER_NAMESPACE,
                "maxNodes": 4,
                "pools": [
                    {"nodePool": SHARES, "instanceType": "p5.48xlarge", "offers": "fractional"},
                    {"nodePool": MIG, "instanceType": "p5.48xlarge", "offers": "mig"},
                    {"nodePool": GANG, "instanceType": "p5.48xlarge", "offers": "exclusive"},
                ],
            }
        )
    )
    sharing = work / "sharing.yaml"
    mps = short_temp_dir()  # every machine's MPS pipes: unix socket paths are limited
    sharing.write_text(
        yaml.safe_dump(
            {"kind": "SharingConfig", "default": {"mode": "fractional"}, "mpsPipeDirectory": str(mps)}
        )
    )
    layout = '{"gpus": {' + ", ".join(f'"{i}": []' for i in range(8)) + "}}"
    common = {"labels": {"gpuweave.io/gpu-node": "true"}, "startup_taints": [STARTUP_TAINT]}
    pools = [
        kp.node_pool(
            SHARES, taints=[_taint(SHARES)], instance_types=["p5.48xlarge"], consolidate_after="5s", **common
        ),
        kp.node_pool(
            MIG,
            taints=[_taint(MIG)],
            instance_types=["p5.48xlarge"],
            annotations={"gpuweave.io/mig-layout": layout},
            **common,
        ),
        kp.node_pool(
            GANG, taints=[_taint(GANG)], instance_types=["p5.48xlarge"], consolidate_after="5s", **common
        ),
    ]
    started = LifecycleCluster(
        work / "cluster",
        pools=pools,
        lifecycle_args=("--capacity-config", str(config), "--no-replacement", "--gang-settle", "8"),
        agent_args={SHARES: ("--sharing-config", str(sharing)), MIG: ("--mig-mode", "demand")},
        manifests=("rbac-node-agent-mig-demand.yaml",),
    )
    try:
        yield started
    finally:
        started.stop()
        remove_tree(mps)


def _buffers(cluster: LifecycleCluster) -> list[dict[str, Any]]:
    listed = kp.custom(cluster.plane).list_namespaced_custom_object(
        *kp.BUFFERS[:2], BUFFER_NAMESPACE, kp.BUFFERS[2]
    )
    return list(listed["items"])


def _booted(cluster: LifecycleCluster, pool: str) -> list[str]:
    """The machines Karpenter's provider made for ``pool`` so far (gone ones included)."""
    return [name for event, name, _ in cluster.machines.history if event == "booted" and pool in name]


class Seen:
    """What a wait saw on its way: the buffers gpuweave asked for (the most machines each asked)."""

    def __init__(self, cluster: LifecycleCluster) -> None:
        self.cluster = cluster
        self.buffers: dict[str, int] = {}
        self.last: dict[str, Any] = {}  # buffer name -> its last status (for failure messages)

    def look(self) -> None:
        self.cluster.check()
        for buffer in _buffers(self.cluster):
            name, replicas = buffer["metadata"]["name"], int(buffer["spec"].get("replicas") or 0)
            self.buffers[name] = max(replicas, self.buffers.get(name, 0))
            self.last[name] = buffer.get("status")


def _running(
    cluster: LifecycleCluster, job: str, count: int, seen: Seen, *, timeout: float = 240
) -> list[Any]:
    def check() -> list[Any] | None:
        seen.look()
        pods = cluster.job_pods(job)
        return pods if len(pods) == count and cluster.running(pods) else None

    try:
        pods: list[Any] = wait_for(f"Job {job}'s {count} pods Running", check, timeout=timeout)
    except BaseException:
        print(f"buffers seen: {seen.buffers}; their last status: {seen.last}")
        _explain(cluster, job)
        raise
    return pods


def _explain(cluster: LifecycleCluster, job: str) -> None:
    """What a failed wait needs to be read later: each pod's phase, node and scheduling message,
    each Node's extended allocatable, and the node agents' warnings."""
    for pod in cluster.job_pods(job):
        scheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        message = scheduled[0].message if scheduled else ""
        print(f"pod {pod.metadata.name}: {pod.status.phase} on {pod.spec.node_name}: {message}")
    for node in cluster.plane.core.list_node().items:
        extended = {k: v for k, v in (node.status.allocatable or {}).items() if "/" in k}
        print(f"node {node.metadata.name}: {extended}")
    for log in sorted(cluster.plane.work.glob("node-agent-*.log")):
        warnings = [line for line in log.read_text(errors="replace").splitlines() if " WARNING " in line]
        print(f"{log.name}:", *warnings[-15:], sep="\n  ")


def _no_buffers(cluster: LifecycleCluster) -> None:
    wait_for("every buffer withdrawn", lambda: not _buffers(cluster), timeout=30)


def test_ten_shares_get_one_new_machine_and_its_buffer_is_withdrawn(cluster: LifecycleCluster) -> None:
    seen = Seen(cluster)
    cluster.create_job(
        "shares", members=10, limits={"gpuweave.io/gpu-compute": "30"}, tolerations=_tolerate(SHARES)
    )
    pods = _running(cluster, "shares", 10, seen)
    assert seen.buffers == {f"gpuweave-shares-{SHARES}": 1}, seen.buffers
    assert len({p.spec.node_name for p in pods}) == 1
    assert len(_booted(cluster, SHARES)) == 1, cluster.machines.history
    _no_buffers(cluster)
    assert len(_booted(cluster, SHARES)) == 1, cluster.machines.history  # no second machine later


def test_a_machine_is_kept_while_its_shares_fit_nowhere_else_and_consolidated_once_empty(
    cluster: LifecycleCluster,
) -> None:
    """While a share on the machine fits no other node by gpuweave's per-GPU view, the machine
    carries ``karpenter.sh/do-not-disrupt`` (Karpenter's own veto); when the shares finish the
    veto goes and Karpenter consolidates the empty machine away."""
    pods = sorted(cluster.job_pods("shares"), key=lambda p: p.metadata.name)
    (node,) = {p.spec.node_name for p in pods}
    for pod in pods[:-1]:
        _finish(cluster, pod)
    last = f"{NAMESPACE}/{pods[-1].metadata.name}"

    def protected() -> bool:
        annotations = cluster.plane.core.read_node(node).metadata.annotations or {}
        return (
            annotations.get("karpenter.sh/do-not-disrupt") == "true"
            and annotations.get("gpuweave.io/protected-shares") == last
        )

    wait_for(f"{node} protected for {last} alone", protected, timeout=30)
    assert node in cluster.machines.running
    _finish(cluster, pods[-1])
    try:
        wait_for(f"{node} consolidated away", lambda: node not in cluster.machines.running, timeout=120)
    except BaseException:
        print(_karpenter_says(cluster, node))
        raise


def _karpenter_says(cluster: LifecycleCluster, node: str) -> str:
    """Karpenter's Events about the node and its NodeClaim, and the claim's conditions."""
    claims = [c for c in kp.nodeclaims(cluster.plane) if (c.get("status") or {}).get("nodeName") == node]
    names = {node, *(c["metadata"]["name"] for c in claims)}
    events = [
        f"{e.involved_object.kind}/{e.involved_object.name} {e.reason}: {e.message}"
        for e in cluster.plane.core.list_event_for_all_namespaces().items
        if e.involved_object.name in names
    ]
    conditions = [
        (c["type"], c["status"], c.get("reason"))
        for claim in claims
        for c in claim["status"].get("conditions", [])
    ]
    annotations = (cluster.plane.core.read_node(node).metadata.annotations or {}) if claims else {}
    return f"events: {events}\nclaim conditions: {conditions}\nnode annotations: {annotations}"


def _finish(cluster: LifecycleCluster, pod: Any) -> None:
    """The pod ends as its kubelet would report it."""
    try:
        cluster.plane.core.patch_namespaced_pod_status(
            pod.metadata.name, NAMESPACE, {"status": {"phase": "Succeeded"}}
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_mig_pods_get_a_machine_the_mig_manager_reshapes(cluster: LifecycleCluster) -> None:
    seen = Seen(cluster)
    cluster.create_job("mig", members=3, limits={"nvidia.com/mig-3g.40gb": "1"}, tolerations=_tolerate(MIG))
    pods = _running(cluster, "mig", 3, seen)
    assert seen.buffers == {f"gpuweave-mig-{MIG}": 1}, seen.buffers
    (node,) = {p.spec.node_name for p in pods}
    allocatable = cluster.plane.core.read_node(node).status.allocatable
    assert int(allocatable.get("nvidia.com/mig-3g.40gb", "0")) >= 3
    assert len(_booted(cluster, MIG)) == 1
    _no_buffers(cluster)


def test_a_gang_that_must_share_a_block_gets_the_machine_its_block_lacks(cluster: LifecycleCluster) -> None:
    """One free 8-GPU machine in each block (each kept by a CPU-only pod): by what Karpenter reads,
    the 2 x 8-GPU gang fits them, so it launches nothing; no block holds both members, so the gang
    waits. gpuweave asks for the one machine block A lacks; the gang runs there."""
    blocks = {}
    for block in BLOCKS:
        job = f"keep-{block[-1]}"
        cluster.create_job(
            job,
            members=1,
            limits={"cpu": "1"},
            tolerations=_tolerate(GANG),
            node_selector={LABEL_AWS_LAYER_3: block},
        )
        (pod,) = _running(cluster, job, 1, Seen(cluster))
        blocks[block] = pod.spec.node_name
    seen = Seen(cluster)
    annotations = {
        "gpuweave.io/gang": "train",
        "gpuweave.io/gang-size": "2",
        "gpuweave.io/gang-tier": LABEL_AWS_LAYER_3,
    }
    cluster.create_job(
        "gang",
        members=2,
        limits={"nvidia.com/gpu": "8"},
        annotations=annotations,
        tolerations=_tolerate(GANG),
    )
    pods = _running(cluster, "gang", 2, seen, timeout=240)
    placed = {p.spec.node_name for p in pods}
    assert len(placed) == 2
    assert {cluster.plane.core.read_node(n).metadata.labels[LABEL_AWS_LAYER_3] for n in placed} == {BLOCKS[0]}
    assert blocks[BLOCKS[0]] in placed
    booted = _booted(cluster, GANG)
    print("\ngang pool machines booted:", booted, "buffers seen:", seen.buffers)
    assert len(booted) == 3, booted  # the two kept machines and the one block A lacked
    assert list(seen.buffers.values()) == [1], seen.buffers
    _no_buffers(cluster)
