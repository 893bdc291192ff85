"""The kustomize base, rendered by kustomize and applied to the real kube-apiserver."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client, dynamic

from tests.e2e.cluster import NAMESPACE, REPO, ControlPlane

pytestmark = pytest.mark.e2e


def test_base_renders_every_part(plane: ControlPlane) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in plane.kustomize(REPO / "manifests")}
    for expected in [
        ("CustomResourceDefinition", "gpunodeinventories.gpuweave.io"),
        ("CustomResourceDefinition", "gpubadhardwares.gpuweave.io"),
        ("DaemonSet", "gpuweave-node-agent"),
        ("Deployment", "gpuweave-scheduler"),
        ("ClusterRole", "gpuweave-node-agent"),
        ("ClusterRole", "gpuweave-extender"),
    ]:
        assert expected in kinds


def test_crds_are_served(plane: ControlPlane) -> None:
    dyn = dynamic.DynamicClient(plane.api)
    inventories = dyn.resources.get(api_version="gpuweave.io/v1alpha1", kind="GpuNodeInventory")
    assert inventories.namespaced is False
    assert dyn.resources.get(api_version="gpuweave.io/v1alpha1", kind="GpuBadHardware").namespaced is False


def test_workloads_were_stored_as_written(plane: ControlPlane) -> None:
    apps = client.AppsV1Api(plane.api)
    daemonset = apps.read_namespaced_daemon_set("gpuweave-node-agent", NAMESPACE)
    pod = daemonset.spec.template.spec
    assert pod.priority_class_name == "system-node-critical"
    assert pod.service_account_name == "gpuweave-node-agent"
    assert (pod.runtime_class_name, pod.host_pid, pod.host_network) == ("nvidia", True, True)
    host_paths = sorted(v.host_path.path for v in pod.volumes if v.host_path)
    assert host_paths == [
        "/dev",
        "/run/gpuweave/mps",  # each fractional GPU's MPS pipe and log directory
        "/run/nvidia-fabricmanager",  # the Fabric Manager's pid file: can an Ampere NVSwitch fabric train
        "/var/lib/gpuweave",  # the agent's own state: bad-GPU list, strikes, kernel-log cursor
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/var/run/cdi",  # the agent's CDI specs, read by the container runtime
    ]
    scheduler = apps.read_namespaced_deployment("gpuweave-scheduler", NAMESPACE)
    containers = {c.name: c for c in scheduler.spec.template.spec.containers}
    assert not (containers["extender"].security_context.privileged or False)


def test_extender_probes_skip_loopback_and_the_agent_runs_in_cluster(plane: ControlPlane) -> None:
    """The kubelet probes from the node: httpGet on the probe port, never host 127.0.0.1."""
    apps = client.AppsV1Api(plane.api)
    scheduler = apps.read_namespaced_deployment("gpuweave-scheduler", NAMESPACE).spec.template.spec
    extender = {c.name: c for c in scheduler.containers}["extender"]
    ports = {p.name: p.container_port for p in extender.ports}
    for probe in (extender.readiness_probe, extender.liveness_probe):
        assert probe.http_get.host is None and probe.http_get.port == "probes"
    assert f"--probe-listen=0.0.0.0:{ports['probes']}" in extender.args
    agent = apps.read_namespaced_daemon_set("gpuweave-node-agent", NAMESPACE).spec.template.spec
    assert "--in-cluster" in agent.containers[0].args
    assert not any(v.config_map for v in agent.volumes)


def _server_dry_run(plane: ControlPlane, doc: dict[str, Any], namespace: str) -> Any:
    pods = dynamic.DynamicClient(plane.api).resources.get(api_version="v1", kind="Pod")
    return pods.create(body=doc, namespace=namespace, dry_run="All")


def test_example_pods_pass_server_validation(plane: ControlPlane, workload_namespace: str) -> None:
    examples = plane.kustomize(REPO / "manifests" / "examples")
    assert len(examples) >= 3
    for doc in examples:
        created = _server_dry_run(plane, doc, workload_namespace)
        limits = created.to_dict()["spec"]["containers"][0]["resources"]["limits"]
        assert any(name.startswith(("nvidia.com/", "gpuweave.io/", "vpc.amazonaws.com/")) for name in limits)
