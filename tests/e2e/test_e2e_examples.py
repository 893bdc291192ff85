"""The example pods (manifests/examples/) as a user applies them: each reaches the gpuweave
scheduler, is placed by the extender (its assignment annotation) and admitted by the kubelet's
device manager with the devices the extender chose.

Three nodes of this module give each example a place: a p5.48xlarge (Hopper GPUs on NVSwitch,
with EFA: the NVLink-required pod), a dgx-a100 whose Node declares a MIG layout (the MIG pod) and
an l40s-pcie-8 labelled with a named sharing configuration (gpuweave.io/sharing-config) its agent
reads from the API server at start (the fractional pod). The whole-GPU pod may land on any node.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import REPO, ControlPlane, SimNode, wait_for
from tests.support.agent_process import remove_tree, short_temp_dir

pytestmark = pytest.mark.e2e

P5, A100, L40S = "e2e-ex-p5", "e2e-ex-a100", "e2e-ex-l40s"
MIG_LAYOUT = {"gpus": {"0": ["1g.10gb"]}}
# what each example asks for, and the node it must land on (None: any node with free GPUs)
EXPECTED = {
    "allreduce-8gpu": ({"nvidia.com/gpu", "vpc.amazonaws.com/efa"}, P5),
    "inference-mig": ({"nvidia.com/mig-1g.10gb"}, A100),
    "notebook-fraction": ({"gpuweave.io/gpu-compute", "gpuweave.io/gpu-memory"}, L40S),
    "train-4gpu": ({"nvidia.com/gpu"}, None),
}


def _node(
    plane: ControlPlane,
    name: str,
    profile: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str],
    agent_args: tuple[str, ...] = (),
) -> SimNode:
    """A Node created with its labels and annotations before its kubelet and agent start (the
    harness node adopts it; the agent reads them as it starts)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}
    plane.core.create_node({"metadata": {"name": name, "labels": labels, "annotations": annotations}})
    return SimNode(
        plane,
        name=name,
        profile=profile,
        agent_kubeconfig=plane.node_agent_kubeconfig(name),
        health_config=plane.work / "health.yaml",
        agent_args=agent_args,
    )


@pytest.fixture(scope="module")
def example_nodes(
    plane: ControlPlane, cluster: dict[str, SimNode], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    configs = tmp_path_factory.mktemp("sharing-configs")
    pipes = short_temp_dir()  # the MPS daemons' sockets: a unix socket path has at most 107 bytes
    (configs / "inference.yaml").write_text(f"default: {{mode: fractional}}\nmpsPipeDirectory: {pipes}\n")
    started: list[SimNode] = []
    try:
        started.append(_node(plane, P5, "p5.48xlarge", labels={}, annotations={}))
        layout = {"gpuweave.io/mig-layout": json.dumps(MIG_LAYOUT)}
        started.append(_node(plane, A100, "dgx-a100", labels={}, annotations=layout))
        shared = {"gpuweave.io/sharing-config": "inference"}
        sharing_args = ("--sharing-config-dir", str(configs))
        started.append(
            _node(plane, L40S, "l40s-pcie-8", labels=shared, annotations={}, agent_args=sharing_args)
        )
        started[0].wait_resource("nvidia.com/gpu", allocatable=8, timeout=120)
        started[1].wait_resource("nvidia.com/mig-1g.10gb", allocatable=1, timeout=120)
        started[2].wait_resource("gpuweave.io/gpu-compute", allocatable=800, timeout=120)
        yield
    finally:
        for node in started:
            node.stop()
        for name in (P5, A100, L40S):
            plane.forget_node(name)
        remove_tree(pipes)


def _placed(plane: ControlPlane, namespace: str, name: str) -> tuple[Any, dict[str, Any]] | None:
    """The pod once bound with the extender's assignment and admitted with devices."""
    pod = plane.core.read_namespaced_pod(name, namespace)
    annotation = (pod.metadata.annotations or {}).get("gpuweave.io/assignment")
    allocation = plane.allocation_of(namespace, name)
    if pod.status.phase == "Failed":
        pytest.fail(f"example {name} failed: {pod.status.reason}: {pod.status.message}")
    return (pod, json.loads(annotation)) if pod.spec.node_name and annotation and allocation else None


def test_every_example_pod_is_placed_through_the_extender_and_admitted(
    plane: ControlPlane, example_nodes: None, workload_namespace: str
) -> None:
    examples = {doc["metadata"]["name"]: doc for doc in plane.kustomize(REPO / "manifests" / "examples")}
    assert set(examples) == set(EXPECTED)
    assert {doc["spec"]["schedulerName"] for doc in examples.values()} == {"gpuweave-scheduler"}
    pods = dynamic.DynamicClient(plane.api).resources.get(api_version="v1", kind="Pod")  # type: ignore[no-untyped-call]
    try:
        for name in sorted(examples, key=lambda n: n != "allreduce-8gpu"):  # the 8-GPU pod first
            pods.create(body=examples[name], namespace=workload_namespace)  # as kubectl sends the YAML
            pod, assignment = wait_for(
                f"example {name} placed and admitted",
                lambda n=name: _placed(plane, workload_namespace, n),  # type: ignore[misc]
                timeout=120,
            )
            resources, node = EXPECTED[name]
            assert assignment["node"] == pod.spec.node_name and (node is None or pod.spec.node_name == node)
            (container,) = examples[name]["spec"]["containers"]
            chosen = assignment["containers"][container["name"]]["devices"]
            allocated = plane.allocation_of(workload_namespace, name)
            assert allocated is not None and set(chosen) == resources, chosen
            given = allocated["containers"][container["name"]]["devices"]
            assert {r: sorted(ids) for r, ids in given.items()} == {r: sorted(v) for r, v in chosen.items()}
    finally:
        for name in examples:
            with contextlib.suppress(ApiException):
                plane.core.delete_namespaced_pod(name, workload_namespace, grace_period_seconds=0)

        def gone() -> bool:
            listed = plane.core.list_namespaced_pod(workload_namespace).items
            return not [p for p in listed if p.metadata.name in examples]

        wait_for("the examples deleted", gone)
