"""The KubeSchedulerConfiguration shipped in manifests/scheduler/ stays valid and in sync."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from devicemodel.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    mig_resource_name,
)
from hardware.mig_catalog import default_catalog

CONFIG = Path(__file__).parents[2] / "manifests" / "scheduler" / "scheduler-config.yaml"
CLAIMS_ENTRY = CONFIG.with_name("claims-extender.yaml")
# Extended resource names: a DNS-1123 prefix, "/", and a qualified name (no "+").
RESOURCE_NAME = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _extender() -> dict[str, Any]:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]  # the claims entry is opt-in (claims-extender.yaml)
    return dict(extender)


def test_the_claims_entry_only_prioritizes_every_pod_on_the_same_sidecar() -> None:
    """Pods with only ResourceClaims request no managed resource, so kube-scheduler skips the
    first entry for them (extender IsInterested); the claims entry (appended on request) has no
    managedResources, so it is called for every pod, and only to prioritize."""
    (extender,) = yaml.safe_load(CONFIG.read_text())["extenders"]
    (claims,) = yaml.safe_load(CLAIMS_ENTRY.read_text())
    assert claims["prioritizeVerb"] == "prioritize-claims"
    assert claims["urlPrefix"] == extender["urlPrefix"]
    assert "managedResources" not in claims
    assert not {"filterVerb", "preemptVerb", "bindVerb"} & set(claims)
    assert claims["ignorable"] is True and claims["nodeCacheCapable"] is True
    assert claims["weight"] > 0 and claims["enableHTTPS"] == extender["enableHTTPS"]


def test_extender_uses_every_verb_and_names_only() -> None:
    extender = _extender()
    assert {extender[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} == {
        "filter",
        "prioritize",
        "preempt",
        "bind",
    }
    assert extender["nodeCacheCapable"] is True
    assert extender["enableHTTPS"] is False
    assert extender["weight"] > 0  # kube-scheduler rejects a prioritizeVerb with weight 0


def test_managed_resources_cover_our_names_and_ignore_only_the_shares() -> None:
    managed = {m["name"]: m["ignoredByScheduler"] for m in _extender()["managedResources"]}
    assert all(RESOURCE_NAME.match(name) for name in managed)
    ignored = {name for name, flag in managed.items() if flag}
    assert ignored == {RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY, RESOURCE_GPU_SHARED}
    assert managed[RESOURCE_GPU] is False and managed[RESOURCE_EFA] is False
    profiles = {p.name for model in default_catalog().models for p in model.profiles}
    assert {mig_resource_name(p) for p in profiles} <= set(managed)


def test_the_profile_packs_on_extender_ties_and_never_outweighs_one_extender_step() -> None:
    """MostAllocated (not the default LeastAllocated, which spreads) with nvidia.com/gpu dominant."""
    (profile,) = yaml.safe_load(CONFIG.read_text())["profiles"]
    (fit,) = [p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit"]
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights[RESOURCE_GPU] > weights["cpu"] + weights["memory"]
    assert not {RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY, RESOURCE_GPU_SHARED} & set(weights)
    assert "plugins" not in profile  # NodeResourcesFit keeps weight 1: at most 100 per node
    assert _extender()["weight"] * 10 > 100  # one extender score step is worth more


MANIFESTS = Path(__file__).parents[2] / "manifests"
GO_MOD = Path(__file__).parents[2] / "tests" / "e2e" / "harness" / "go.mod"


def _containers(path: Path) -> dict[str, dict[str, Any]]:
    (workload,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def test_extender_probes_use_the_probe_port_and_the_protocol_port_stays_on_loopback() -> None:
    extender = _containers(MANIFESTS / "scheduler" / "deployment.yaml")["extender"]
    args = extender["args"]
    assert _flag(args, "--listen").startswith("127.0.0.1:")
    probe_port = int(_flag(args, "--probe-listen").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in extender["ports"]}
    assert "--in-cluster" in args
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = extender[probe]["httpGet"]
        assert get["path"] == path and "host" not in get  # the kubelet probes the pod's address
        assert ports[get["port"]] == probe_port


def test_kube_scheduler_image_is_the_version_the_e2e_suite_tests() -> None:
    tested = re.search(r"^\s*k8s\.io/kubernetes (v[0-9.]+)$", GO_MOD.read_text(), re.MULTILINE)
    assert tested is not None
    image = _containers(MANIFESTS / "scheduler" / "deployment.yaml")["kube-scheduler"]["image"]
    assert image == f"registry.k8s.io/kube-scheduler:{tested.group(1)}"


def test_node_agent_uses_its_service_account_directly() -> None:
    agent = _containers(MANIFESTS / "node-agent-daemonset.yaml")["node-agent"]
    assert "--in-cluster" in agent["args"]
    assert not any(a.startswith("--kubeconfig") for a in agent["args"])
    resources = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    assert all((MANIFESTS / r).exists() for r in resources)
