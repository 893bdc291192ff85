"""Uninstalling the chart from the real node leaves nothing of gpuweave's there.

The chart is installed on the real node as tests/e2e/test_e2e_realnode_chart.py installs it (its
``realnode`` fixture); a pod holds two GPUs. Then what ``helm uninstall`` does, in its order: the
pre-delete hook (the chart's hook ServiceAccount and RBAC applied, ``gpuweave uninstall`` run with
that account's token, as the hook Job runs it), then the release's objects deleted (the DaemonSet
and, as the garbage collector would, its pods). The Node has none of the agent's labels, taints,
annotation or conditions, no GpuNodeInventory is left, the node's CDI directory holds no gpuweave
spec, the kubelet's directory no gpuweave socket and the agent's state directory (the chart's
``/var/lib/gpuweave``, inside the node's mount namespace) nothing but the bad-hardware list; the
pod kept running in the same container throughout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.node.cleanup import BAD_HARDWARE_FILES, leftovers
from tests.e2e.cluster import REPO, wait_for
from tests.e2e.realnode import SEER_NAMESPACE, RealNode, container_id, run_seer
from tests.e2e.test_e2e_realnode_chart import (  # noqa: F401 (the chart's real node, a module fixture)
    AGENT_LABELS,
    AGENT_NAMESPACE,
    NODE,
    chart_values,
    realnode,
)
from tests.support.opscheck import is_hook, render_chart

# gpuweave uninstall sweeps every Node of the cluster; a previous release's chart replaces the base
pytestmark = [pytest.mark.realnode, pytest.mark.cluster_wide]


def node_root(node: RealNode) -> Path:
    """The node's mount namespace as its kubelet sees it (``/proc/<pid>/root``): where the chart's
    host paths (``/var/lib/gpuweave``) are."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kubelet" in argv[1:2] and any(str(node.dir).encode() in a for a in argv):
            return entry / "root"
    raise AssertionError(f"no kubelet process of {node.name}")


def run_hook(node: RealNode, tmp_path: Path) -> str:
    """The chart's pre-delete hook: its account and RBAC, and the Job's command under that account."""
    plane = node.plane
    repository, tag = "gpuweave.test/gpuweave", "dev"
    hooks = [d for d in render_chart(chart_values(repository, tag), work=tmp_path, hooks=True) if is_hook(d)]
    plane.apply([d for d in hooks if d["kind"] != "Job"])
    kubeconfig = plane.service_account_kubeconfig("gpuweave-uninstall", namespace=AGENT_NAMESPACE)
    argv = [
        sys.executable,
        "-m",
        "gpuweave",
        "uninstall",
        "--kubeconfig",
        str(kubeconfig),
        "--timeout",
        "150",
    ]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def delete_release_objects(node: RealNode) -> None:
    """What ``helm uninstall`` deletes after its hook (the part that matters on the node: the
    DaemonSet), and the DaemonSet's pods, which the garbage collector (not run here) would delete."""
    plane = node.plane
    try:
        client.AppsV1Api(plane.api).delete_namespaced_daemon_set("gpuweave-node-agent", AGENT_NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    for pod in plane.core.list_namespaced_pod(AGENT_NAMESPACE, label_selector=AGENT_LABELS).items:
        plane.core.delete_namespaced_pod(pod.metadata.name, AGENT_NAMESPACE)

    def gone() -> bool:
        return not plane.core.list_namespaced_pod(AGENT_NAMESPACE, label_selector=AGENT_LABELS).items

    wait_for("the agent's pods gone", gone, timeout=120)


def test_uninstall_leaves_nothing_of_gpuweave_on_the_node(realnode: RealNode, tmp_path: Path) -> None:  # noqa: F811
    plane = realnode.plane
    running, _ = run_seer(realnode, "seer-uninstall", {RESOURCE_GPU: "2"})
    state = node_root(realnode) / "var" / "lib" / "gpuweave"
    before = plane.api.sanitize_for_serialization(plane.core.read_node(NODE))
    assert leftovers(before).labels and any(realnode.cdi_dir.glob("gpuweave-*")) and any(state.iterdir())
    assert any(realnode.plugin_dir.glob("gpuweave-*.sock"))

    try:
        output = run_hook(realnode, tmp_path)
        # the session's simulated nodes run no agent pod, so the sweep names them in its WARNING;
        # the real node's own agent cleaned it
        warnings = [line for line in output.splitlines() if "WARNING" in line]
        assert "1 of 1 nodes cleaned" in output and not [w for w in warnings if NODE in w], output
    finally:
        delete_release_objects(realnode)  # also when the hook failed: the fixture applies the base again

    after = plane.api.sanitize_for_serialization(plane.core.read_node(NODE))
    assert not leftovers(after), leftovers(after).describe()
    labels = after["metadata"].get("labels") or {}
    assert not [
        k for k in labels if k.startswith(("nvidia.com/", "gpuweave.io/")) and k != "gpuweave.io/gpu-node"
    ]
    assert not [t for t in after["spec"].get("taints") or [] if t["key"].startswith("gpuweave.io/")]
    assert not [k for k in after["metadata"].get("annotations") or {} if k.startswith("gpuweave.io/")]
    with pytest.raises(ApiException) as missing:
        client.CustomObjectsApi(plane.api).get_cluster_custom_object(
            "gpuweave.io", "v1alpha1", "gpunodeinventories", NODE
        )
    assert missing.value.status == 404
    assert not list(realnode.cdi_dir.glob("gpuweave*"))
    assert not list(realnode.plugin_dir.glob("gpuweave-*"))
    # the directory itself stays (the chart's hostPath mount point) with at most the bad-hardware list
    assert not state.exists() or {p.name for p in state.iterdir()} <= BAD_HARDWARE_FILES
    still = plane.core.read_namespaced_pod("seer-uninstall", SEER_NAMESPACE)
    assert container_id(still) == container_id(running)
    plane.core.delete_namespaced_pod("seer-uninstall", SEER_NAMESPACE)
