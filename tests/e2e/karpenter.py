"""Karpenter in the e2e cluster: its controllers with the kwok cloud provider, and the machines.

``start_karpenter`` runs ``tests/e2e/karpenter/bin/karpenter`` (Karpenter's own controllers:
provisioning, disruption, NodeClaim lifecycle and termination, node repair, CapacityBuffers) with
the admin kubeconfig, leader election off, in a network namespace of its own (its operator binds
its metrics and health ports on every interface; ``tests/support/netns_relay.py`` relays only the
API server's port). Its kwok provider "launches" an instance by creating the Node object itself;
``KwokMachines`` plays the machine that boots: for every Node Karpenter's provider created it starts
``harness node`` (the kubelet's device manager and admission, adopting the existing Node) and
``gpuweave node-agent --simulate <profile of the instance type>``, and stops them when the Node is
deleted (the instance terminated).

Instance types list what AWS lists: cpu, memory and ``nvidia.com/gpu`` (``INSTANCE_TYPES``); each
name is a built-in node profile. Offerings carry a zone and a network block
(``topology.k8s.aws/network-node-layer-3``), so Karpenter knows the block a node will have.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane, Process, SimNode, wait_for
from tests.support.control_plane import REPO, built_binary
from topology.network import LABEL_AWS_LAYER_3

KARPENTER_DIR = REPO / "tests" / "e2e" / "karpenter"
KARPENTER = ("karpenter.sh", "v1")
NODECLAIMS = (*KARPENTER, "nodeclaims")
NODEPOOLS = (*KARPENTER, "nodepools")
NODECLASSES = ("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses")
BUFFERS = ("autoscaling.x-k8s.io", "v1beta1", "capacitybuffers")
LABEL_NODEPOOL = "karpenter.sh/nodepool"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
KWOK_PROVIDER = "kwok://"
NODE_CLASS = "e2e-kwok"
ZONE = "e2e-zone-a"

# name -> (cpu, memory, GPUs, on-demand price per hour); names are built-in node profiles.
INSTANCE_TYPES: dict[str, tuple[str, str, int, float]] = {
    "p5.48xlarge": ("192", "2048Gi", 8, 98.32),
    "p4d.24xlarge": ("96", "1152Gi", 8, 32.77),
}


def karpenter_binary() -> Path:
    return built_binary(
        KARPENTER_DIR / "bin" / "karpenter",
        env="GPUWEAVE_E2E_KARPENTER",
        what="Karpenter controllers (kwok provider)",
        build="tests/e2e/karpenter/build.sh (run by tests/e2e/harness/build.sh)",
    )


def karpenter_crds() -> list[dict[str, Any]]:
    """Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer) and the kwok provider's
    KWOKNodeClass, read from the module cache where build.sh recorded Karpenter's module."""
    record = KARPENTER_DIR / "bin" / "modules.json"
    if not record.is_file():
        pytest.fail(f"{record} is missing: run tests/e2e/karpenter/build.sh", pytrace=False)
    module = Path(json.loads(record.read_text())["sigs.k8s.io/karpenter"])
    if not module.is_dir():
        pytest.fail(f"{module} is gone from Go's module cache: run build.sh again", pytrace=False)
    paths = sorted((module / "pkg" / "apis" / "crds").glob("*.yaml"))
    paths += sorted((module / "kwok" / "apis" / "crds").glob("*.yaml"))
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def instance_types(blocks: Sequence[str]) -> list[dict[str, Any]]:
    """The kwok provider's instance-types file: one on-demand offering per network block."""
    out = []
    for name, (cpu, memory, gpus, price) in INSTANCE_TYPES.items():
        offerings = [
            {
                "Price": price,
                "Available": True,
                "Requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                    {"key": LABEL_AWS_LAYER_3, "operator": "In", "values": [block]},
                ],
            }
            for block in blocks
        ]
        resources = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"}
        out.append(
            {
                "name": name,
                "offerings": offerings,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": resources,
            }
        )
    return out


def start_karpenter(
    plane: ControlPlane, *, blocks: Sequence[str], name: str = "karpenter", log_level: str = "debug"
) -> Process:
    """Karpenter's controllers with the kwok provider; returns once its NodeClass is Ready and it
    reports a NodePool ready (create one first)."""
    types = plane.work / f"{name}-instance-types.json"
    types.write_text(json.dumps(instance_types(blocks)))
    port = plane.server.rsplit(":", 1)[1]
    env = {
        "KUBECONFIG": str(plane.admin_kubeconfig),
        "SYSTEM_NAMESPACE": "kube-system",
        "DISABLE_LEADER_ELECTION": "true",
        "FEATURE_GATES": "NodeRepair=true,CapacityBuffer=true,ReservedCapacity=false,"
        "SpotToSpotConsolidation=false,NodeOverlay=false,StaticCapacity=false",
        "INSTANCE_TYPES_FILE_PATH": str(types),
        "LOG_LEVEL": log_level,
        "BATCH_IDLE_DURATION": "1s",
        "BATCH_MAX_DURATION": "5s",
        "METRICS_PORT": "8080",
        "HEALTH_PROBE_PORT": "8081",
    }
    argv = [sys.executable, "-m", "tests.support.netns_relay"]
    argv += ["--forward", f"127.0.0.1:{port}", "--", str(karpenter_binary())]
    return Process(name, argv, log_dir=plane.work, env=env)


def node_class() -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
    }


def node_pool(
    name: str,
    *,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, str]],
    instance_types: Sequence[str],
    consolidate_after: str = "Never",
    consolidation_policy: str = "WhenEmptyOrUnderutilized",
    startup_taints: Sequence[Mapping[str, str]] = (),
    gpu_limit: int = 64,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A NodePool of the kwok NodeClass, limited to ``instance_types`` and ``gpu_limit`` GPUs."""
    requirements = [
        {"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": list(instance_types)},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
    ]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"labels": dict(labels), "annotations": dict(annotations or {})},
                "spec": {
                    "requirements": requirements,
                    "taints": [dict(t) for t in taints],
                    "startupTaints": [dict(t) for t in startup_taints],
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NODE_CLASS,
                    },
                    "expireAfter": "Never",
                },
            },
            "limits": {"nvidia.com/gpu": str(gpu_limit)},
            "disruption": {
                "consolidationPolicy": consolidation_policy,
                "consolidateAfter": consolidate_after,
                "budgets": [{"nodes": "100%"}],
            },
        },
    }


class KwokMachines:
    """The machines behind the Nodes Karpenter's kwok provider creates: each such Node gets a
    ``SimNode`` (kubelet side + simulated node agent with the instance type's profile), stopped
    when the Node is gone. Polls the Node list every ``every`` seconds on its own thread."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        agent_kubeconfig: Path,
        health_config: Path | None = None,
        agent_args: Mapping[str, tuple[str, ...]] | None = None,
        every: float = 0.25,
    ) -> None:
        self.plane = plane
        self.agent_kubeconfig = agent_kubeconfig
        self.health_config = health_config
        self.agent_args = dict(agent_args or {})  # NodePool name -> extra node-agent arguments
        self.every = every
        self.running: dict[str, SimNode] = {}
        self.history: list[tuple[str, str, str]] = []  # (event, node, instance type)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._count = 0
        self._errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="kwok-machines", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._sync()
            except Exception as exc:  # reported by check(); the loop goes on
                self._errors.append(repr(exc))

    def _sync(self) -> None:
        nodes = {n.metadata.name: n for n in self.plane.core.list_node().items}
        for name, node in nodes.items():
            if (node.spec.provider_id or "").startswith(KWOK_PROVIDER) and name not in self.running:
                self._boot(node)
        for name in [n for n in self.running if n not in nodes]:
            with self._lock:
                machine = self.running.pop(name)
            machine.stop()
            self.history.append(("terminated", name, ""))

    def _boot(self, node: Any) -> None:
        labels = node.metadata.labels or {}
        instance = labels.get(LABEL_INSTANCE_TYPE, "")
        if instance not in INSTANCE_TYPES:
            self._errors.append(f"{node.metadata.name}: unknown instance type {instance!r}")
            return
        cpu, memory, _, _ = INSTANCE_TYPES[instance]
        self._count += 1
        machine = SimNode(
            self.plane,
            name=node.metadata.name,
            profile=instance,
            agent_kubeconfig=self.agent_kubeconfig,
            health_config=self.health_config,
            agent_args=self.agent_args.get(labels.get(LABEL_NODEPOOL, ""), ()),
            node_args=("--cpu", cpu, "--memory", memory),
            base=self.plane.work / "m" / str(self._count),
            log_level="INFO",
        )
        with self._lock:
            self.running[node.metadata.name] = machine
        self.history.append(("booted", node.metadata.name, instance))

    def machine(self, node: str) -> SimNode:
        with self._lock:
            return self.running[node]

    def check(self) -> None:
        if self._errors:
            pytest.fail(f"kwok machines: {self._errors}", pytrace=False)
        with self._lock:
            machines = list(self.running.values())
        for machine in machines:
            machine.agent.check_alive()
            machine.kubelet.check_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            machines, self.running = list(self.running.values()), {}
        for machine in machines:
            machine.stop()


def custom(plane: ControlPlane) -> Any:
    return client.CustomObjectsApi(plane.api)


def nodeclaims(plane: ControlPlane) -> list[dict[str, Any]]:
    return list(custom(plane).list_cluster_custom_object(*NODECLAIMS)["items"])


def karpenter_nodes(plane: ControlPlane, pool: str | None = None) -> list[Any]:
    """The Nodes Karpenter's provider made (of ``pool``), not being deleted."""
    return [
        n
        for n in plane.core.list_node().items
        if (n.spec.provider_id or "").startswith(KWOK_PROVIDER)
        and n.metadata.deletion_timestamp is None
        and (pool is None or (n.metadata.labels or {}).get(LABEL_NODEPOOL) == pool)
    ]


def wait_pool_ready(plane: ControlPlane, name: str, karpenter: Process, timeout: float = 90) -> None:
    """Karpenter read the NodePool and its NodeClass: the NodePool's Ready condition is True."""

    def ready() -> bool:
        karpenter.check_alive()
        pool = custom(plane).get_cluster_custom_object(*NODEPOOLS, name)
        conditions = (pool.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(f"NodePool {name} Ready", ready, timeout=timeout)


def delete_all(plane: ControlPlane, group: tuple[str, str, str]) -> None:
    for item in custom(plane).list_cluster_custom_object(*group)["items"]:
        try:
            custom(plane).delete_cluster_custom_object(*group, item["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise
