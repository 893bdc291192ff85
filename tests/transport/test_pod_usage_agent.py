"""Per-pod GPU use end to end on the simulated backend: two pods share GPU 0 through MPS with known
loads; the node agent's usage service reads them through the NVML call surface and /proc, takes
their limits from the kubelet's pod-resources API (real gRPC on a unix socket), serves them on
/metrics (real HTTP, parsed as Prometheus parses it), publishes them in the inventory's
status.podUsage through the real kubernetes client, which `gpuweave status` then shows per GPU;
and the pod over its share's memory limit is evicted (Eviction API, Event, metric) once it stayed
over the limit for the grace, the other not at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from hardware.gpu_processes import GpuProcessReader
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.node import SimulatedNode
from health.kube import KubeCluster
from nodeagent.metrics import serve_metrics
from nodeagent.pod_usage import GIB, PodIdentities
from nodeagent.podresources import PodResourcesClient
from nodeagent.published import inventory_object
from nodeagent.usage_kube import KubeEvictor, UsagePublisher
from nodeagent.usage_service import PodUsageService, UsageSettings
from tests.support.agent_process import short_temp_dir
from tests.support.loopback_api import answer_json, loopback_api
from tests.support.podresources_server import PodResourcesServer

NODE = "n0"
PLAN = SharingPlan(per_gpu={"0": GpuSharing(SharingMode.FRACTIONAL)})
PODS = {  # name -> (uid, container id, pid, memory GiB, SM %, compute units, memory units)
    "infer-a": ("11111111-aaaa-4aaa-8aaa-000000000001", "a" * 64, 1001, 3, 30, 30, 4),
    "infer-b": ("22222222-bbbb-4bbb-8bbb-000000000002", "b" * 64, 1002, 6, 50, 50, 5),
}


class Api(BaseHTTPRequestHandler):
    """The API paths the usage service writes: an eviction, an Event, the inventory's status."""

    protocol_version = "HTTP/1.1"
    requests: ClassVar[list[tuple[str, str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def do_POST(self) -> None:
        body = self._body()
        self.requests.append(("POST", self.path, body))
        self._answer(201, body)

    def do_PATCH(self) -> None:
        body = self._body()
        self.requests.append(("PATCH", self.path, body))
        self._answer(200, {"apiVersion": "gpuweave.io/v1alpha1", "kind": "GpuNodeInventory", **body})

    def _answer(self, status: int, body: Any) -> None:
        answer_json(self, status, body)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimulatedBackend]:
    backend = SimulatedBackend(load_profile("l40s-pcie-8"), tmp_path / "hw", node_name=NODE)
    backend.discover()
    table = backend.node.processes
    table.run(0, 900, memory_bytes=GIB // 4, sm_percent=0)  # the MPS server: in no pod
    for uid, cid, pid, memory, sm, _, _ in PODS.values():
        table.run(0, pid, memory_bytes=memory * GIB, sm_percent=sm, mps=True, pod_uid=uid, container_id=cid)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def kubelet(node: SimulatedBackend) -> Iterator[PodResourcesServer]:
    root = short_temp_dir()
    uuid = node.inventory.gpus[0].uuid
    try:
        with PodResourcesServer(root / "kubelet.sock") as server:
            for name, (_, _, _, _, _, compute, memory) in PODS.items():
                units = {
                    "gpuweave.io/gpu-compute": [f"{uuid}::compute-{k}" for k in range(compute)],
                    "gpuweave.io/gpu-memory": [f"{uuid}::memory-{k}" for k in range(memory)],
                }
                server.admit("team", name, {"main": units})
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


def identities() -> PodIdentities:
    pods = PodIdentities()
    for name, (uid, cid, *_) in PODS.items():
        status = {"containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}]}
        pods.upsert({"metadata": {"uid": uid, "namespace": "team", "name": name}, "status": status})
    return pods


def scrape(port: int) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(("gpuweave_pod_gpu_", "gpuweave_share_memory_evictions")):
                who = sample.labels.get("pod") or sample.labels.get("outcome", "")
                found[(sample.name, who)] = sample.value
                if sample.labels.get("pod"):
                    assert sample.labels["gpu"] == "0" and sample.labels["container"] == "main"
    return found


def test_two_pods_on_one_gpu_measured_exported_shown_and_the_one_over_its_limit_evicted(
    node: SimulatedBackend, kubelet: PodResourcesServer, tmp_path: Path
) -> None:
    Api.requests = []
    clock = Clock()
    registry = CollectorRegistry()
    with loopback_api(Api) as api:
        service = PodUsageService(
            reader=GpuProcessReader(node.nvml.caller),
            proc_root=SimulatedNode.proc_root(node.sysfs_root) or Path("/proc"),
            node=lambda: (node.inventory, PLAN),
            identities=identities(),
            containers=PodResourcesClient(kubelet.socket_path, timeout=5).containers,
            registry=registry,
            settings=UsageSettings(memory_grace_s=30),
            evictor=KubeEvictor(KubeCluster(api, node_name=NODE)),
            clock=clock,
        )
        publisher = UsagePublisher(api, node=NODE, rows=service.published, clock=clock)
        service.listeners.append(publisher.changed)
        port = _free_port()
        stop = serve_metrics(registry, host="127.0.0.1", port=port)
        try:
            service.round()
            metrics = scrape(port)
            clock.now = 29.0
            service.round()
            assert not [r for r in Api.requests if r[1].endswith("/eviction")]  # within the grace
            clock.now = 31.0
            service.round()
            after = scrape(port)
        finally:
            stop()
    util, used, limit = (
        f"gpuweave_pod_gpu_{m}" for m in ("utilization_ratio", "memory_used_bytes", "memory_limit_bytes")
    )
    assert metrics[(util, "infer-a")] == pytest.approx(0.3) and metrics[(util, "infer-b")] == pytest.approx(
        0.5
    )
    assert (metrics[(used, "infer-a")], metrics[(used, "infer-b")]) == (3 * GIB, 6 * GIB)
    assert (metrics[(limit, "infer-a")], metrics[(limit, "infer-b")]) == (4 * GIB, 5 * GIB)
    assert len({who for (_, who) in metrics}) == 2  # the MPS server is no pod's
    evictions = [(m, p) for m, p, _ in Api.requests if p.endswith("/eviction")]
    assert evictions == [("POST", "/api/v1/namespaces/team/pods/infer-b/eviction")]
    (body,) = [b for m, p, b in Api.requests if p.endswith("/eviction")]
    assert body["deleteOptions"]["preconditions"]["uid"] == PODS["infer-b"][0]  # that pod, by its UID
    assert body["metadata"]["labels"] == {"gpuweave.io/node-agent-eviction": "true"}  # the policy's mark
    (event,) = [b for m, p, b in Api.requests if p.endswith("/events")]
    assert event["reason"] == "GpuShareMemoryExceeded" and event["involvedObject"]["name"] == "infer-b"
    assert "6.0 GiB" in event["message"] and "5.0 GiB" in event["message"]
    assert after[("gpuweave_share_memory_evictions_total", "evicted")] == 1
    patches = [
        b for m, p, b in Api.requests if m == "PATCH" and p.endswith(f"/gpunodeinventories/{NODE}/status")
    ]
    assert len(patches) == 1  # once: the later rounds are within the minute
    shown = _status_text(node, patches[0]["status"]["podUsage"], tmp_path)
    assert "use team/infer-a/main: 30% SMs, 3.0 of 4.0 GiB" in shown
    assert "use team/infer-b/main: 50% SMs, 6.0 of 5.0 GiB" in shown


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status_text(node: SimulatedBackend, usage: list[dict[str, Any]], tmp_path: Path) -> str:
    """`gpuweave status --snapshot` over the node's inventory as the agent publishes it."""
    inventory = inventory_object(node.inventory, sharing=PLAN)
    inventory["status"]["podUsage"] = usage
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}, inventory],
    }
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump(listed))
    done = subprocess.run(
        [sys.executable, "-m", "gpuweave", "status", "--snapshot", str(path), "--node", NODE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout
