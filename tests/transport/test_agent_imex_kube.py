"""The node agent's IMEX reconciler against a real kube-apiserver (the real watch and Node objects).

Three trays in one clique and one in another, each a Node with an InternalIP and the clique label
the agent publishes. A pod bound to ``a0`` that asks for the tray's IMEX channel carries the
domain the extender wrote (the gang's nodes, one of them in the other clique): the agent of ``a0``
writes the IMEX daemon's node list with the InternalIPs of the domain's nodes in its own clique,
leaves the other out and says so, and removes it when the pod is deleted. A pod that only carries
the annotation (no channel asked for) configures nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.assignment import ImexDomain, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU, RESOURCE_IMEX_CHANNEL
from deviceplugin.kube import KubeParts
from gpuweave.node.imex import NODES_CONFIG, ImexConfigWriter, ImexReconciler
from gpuweave.simulate.cluster_objects import pod_object
from nodeagent.metrics import AgentMetrics
from tests.support.control_plane import ControlPlane, wait_for
from topology.network import LABEL_GPU_CLIQUE

pytestmark = pytest.mark.e2e

CLIQUE = "6a2b1c3d-0000-4000-8000-00000000aaaa.1"
OTHER = "6a2b1c3d-0000-4000-8000-00000000aaaa.2"
TRAYS = {"imex-a0": (CLIQUE, "10.0.0.10"), "imex-a1": (CLIQUE, "10.0.0.11"),
         "imex-a2": (CLIQUE, "10.0.0.12"), "imex-b0": (OTHER, "10.0.1.10")}  # fmt: skip


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("imex"))
    try:
        plane.core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        for name, (clique, address) in TRAYS.items():
            plane.core.create_node({"metadata": {"name": name, "labels": {LABEL_GPU_CLIQUE: clique}}})
            status = {"addresses": [{"type": "InternalIP", "address": address}]}
            plane.core.patch_node_status(name, {"status": status})
        yield plane
    finally:
        plane.stop()


def _pod(name: str, *, channel: bool) -> dict[str, Any]:
    limits: dict[str, int] = {RESOURCE_GPU: 4}
    if channel:
        limits[RESOURCE_IMEX_CHANNEL] = 1
    domain = ImexDomain(name="ml-gang-train-0123456789", nodes=("imex-a0", "imex-a1", "imex-b0"))
    assignment = PodAssignment(node="imex-a0", containers={}, imex=domain)
    annotations = {ANNOTATION_ASSIGNMENT: assignment.to_annotation()}
    body = pod_object(name, limits=limits, node="imex-a0", annotations=annotations)
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        body["metadata"].pop(key, None)
    body.pop("status", None)
    return body


def test_the_channel_holders_domain_is_written_with_its_cliques_addresses_and_removed_with_it(
    plane: ControlPlane, tmp_path: Path
) -> None:
    parts = KubeParts(plane.admin_kubeconfig, node="imex-a0", metrics=AgentMetrics())
    writer = ImexConfigWriter(tmp_path / "imex", simulated=True)
    reconciler = ImexReconciler(
        parts.view, node="imex-a0", clique=lambda: CLIQUE, peers=parts.clique_peers(), writer=writer
    )
    parts.pods.start()
    reconciler.start()
    nodes_config = tmp_path / "imex" / NODES_CONFIG
    try:
        plane.core.create_namespaced_pod("default", _pod("forger", channel=False))
        wait_for("the agent to see the forger", lambda: parts.view.assigned() or None)
        assert not nodes_config.exists()  # an annotation alone configures nothing

        plane.core.create_namespaced_pod("default", _pod("holder", channel=True))
        # the writer replaces the node list, then its record of the domain: wait for both
        wait_for("the node list", lambda: (nodes_config.exists() and writer.current()) or None, timeout=15)
        assert nodes_config.read_text() == "10.0.0.10\n10.0.0.11\n"  # imex-b0 is in another clique
        record = writer.current()
        assert record is not None and record["holder"] == "default/holder"
        assert record["nodes"] == ["imex-a0", "imex-a1"]
        assert "left out imex-b0" in reconciler.problem

        plane.core.delete_namespaced_pod("holder", "default", grace_period_seconds=0)
        wait_for(
            "the domain torn down",
            lambda: (not nodes_config.exists() and writer.current() is None) or None,
            timeout=15,
        )
    finally:
        reconciler.stop()
        parts.stop()
