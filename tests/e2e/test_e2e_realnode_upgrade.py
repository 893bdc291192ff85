"""Upgrading the chart on the real node from an earlier commit of this repository to this one.

The earlier commit's chart (``git archive`` of its ``manifests/``, links and all) is rendered by
Helm with the test values of tests/e2e/test_e2e_realnode_chart.py and installed with that commit's
own agent image (built from its tree by ``release.image``, as scripts/build-image builds one); a pod
holds two GPUs. Then what docs/deploy.md's upgrade does: this chart's CRDs and objects applied
over it (server-side, as ``kubectl apply --server-side`` and ``helm upgrade`` write), with this
tree's image. The DaemonSet replaces the agent; the new agent registers the same device IDs, the
pod keeps running in the same container, and the GPUs it holds are not handed to a new pod.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU
from release.image import build_image
from tests.e2e.cluster import REPO, ControlPlane, wait_for
from tests.e2e.realnode import (
    AGENT_IMAGE,
    SEER_NAMESPACE,
    RealNode,
    allocatable_ids,
    container_id,
    realnode_binaries,
    run_seer,
)
from tests.e2e.test_e2e_realnode_chart import agent_pod, chart_values, installed_chart
from tests.support.opscheck import render_chart

# gpuweave uninstall sweeps every Node of the cluster; a previous release's chart replaces the base
pytestmark = [pytest.mark.realnode, pytest.mark.cluster_wide]

# The tree this branch of work started from: its chart and agent are "the previous version".
PREVIOUS = "97fd722ff921b2c17d48d898c9fa8cb1fd2cab5e"
PREVIOUS_IMAGE = "gpuweave.test/gpuweave:previous"


def previous_tree(out: Path) -> Path:
    """The files of commit ``PREVIOUS`` under ``out`` (symbolic links kept, as the chart needs)."""
    archive = out / "previous.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), PREVIOUS], check=True)
    tree = out / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="tar")
    return tree


def _ids(node: RealNode) -> dict[str, set[str]]:
    return {r: allocatable_ids(node, r) for r in (RESOURCE_GPU, RESOURCE_EFA)}


def test_upgrade_keeps_the_pods_devices_and_the_agent_registers_the_same_ids(
    plane: ControlPlane, scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    tree = previous_tree(tmp_path)
    old_image = tmp_path / "gpuweave-previous.tar"
    build_image(old_image, name=PREVIOUS_IMAGE, base=realnode_binaries() / "agent-base.tar", repo=tree)
    repository, tag = AGENT_IMAGE.rsplit(":", 1)
    old_values = chart_values(repository, PREVIOUS_IMAGE.rsplit(":", 1)[1])
    old = render_chart(old_values, work=tmp_path, chart=tree / "manifests" / "helm" / "gpuweave")
    with installed_chart(plane, scheduler_kubeconfig, old, more_images=[old_image]) as node:
        before_agent = agent_pod(plane)
        assert before_agent.spec.containers[0].image == PREVIOUS_IMAGE
        running, seen = run_seer(node, "seer-upgrade", {RESOURCE_GPU: "2"})
        held = set(seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(","))
        before = _ids(node)

        new_work = tmp_path / "new"
        new_work.mkdir()
        plane.apply(render_chart(chart_values(repository, tag), work=new_work))  # CRDs first, then the rest

        def upgraded() -> bool:
            agent = agent_pod(plane)
            return (
                agent is not None
                and agent.spec.containers[0].image == AGENT_IMAGE
                and agent.status.phase == "Running"
                and _ids(node) == before
            )

        wait_for("the new agent registered with the same IDs", upgraded, timeout=180)
        assert agent_pod(plane).metadata.uid != before_agent.metadata.uid
        still = plane.core.read_namespaced_pod("seer-upgrade", SEER_NAMESPACE)
        assert still.status.phase == "Running" and container_id(still) == container_id(running)
        _, after = run_seer(node, "seer-upgrade-after", {RESOURCE_GPU: "6"})  # every other GPU
        assert not set(after["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")) & held
        for name in ("seer-upgrade", "seer-upgrade-after"):
            plane.core.delete_namespaced_pod(name, SEER_NAMESPACE)
