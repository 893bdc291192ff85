"""``health.kube.KubeCluster`` with the real kubernetes client over HTTP against a small API server.

The server on 127.0.0.1 (port 0) keeps nodes, pods, events and GpuBadHardware objects in memory
and answers the calls the health monitor makes the way the kube-apiserver does: strategic-merge
patches (conditions merged by type, taints replaced), Eviction returning 429 for a pod its
PodDisruptionBudget protects, 409 for an object that exists.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, ANNOTATION_OPT_OUT_EVICTION
from devicemodel.gangs import (
    ANNOTATION_GANG_EVICTION,
    LABEL_JOBSET_NAME,
    LABEL_JOBSET_RESTART,
    LABEL_REPLICATED_JOB,
)
from devicemodel.text import MAX_EVENT_CHARS
from health.badlist import BadGpu
from health.kube import EVICTION_LABEL, NODE_PATCH_ATTEMPTS, KubeCluster, bad_hardware_name
from health.remediation import EvictionOutcome, PodRef
from health.scope import NodeCondition
from tests.support.loopback_api import answer_json
from tests.support.pods import pod_body

BAD_PATH = "/apis/gpuweave.io/v1alpha1/gpubadhardwares"


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif key == "conditions" and isinstance(value, list):
            by_type = {c["type"]: c for c in target.get(key, [])}
            for cond in value:
                by_type.setdefault(cond["type"], {}).update(cond)
            target[key] = list(by_type.values())
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


class ApiState:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.bad: dict[str, dict[str, Any]] = {}
        self.evictions: list[tuple[str, str, int]] = []
        self.eviction_bodies: list[dict[str, Any]] = []
        self.writes_in_between = 0  # Node patches that find the Node changed since it was read
        self.lock = threading.Lock()


def handler_for(api: ApiState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, code: int, body: dict[str, Any]) -> None:
            answer_json(self, code, body)

        def body(self) -> Any:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

        def do_GET(self) -> None:
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            with api.lock:
                if url.path == "/api/v1/pods":
                    node = parse_qs(url.query)["fieldSelector"][0].split("=")[1]
                    items = [p for p in api.pods.values() if p["spec"]["nodeName"] == node]
                    return self.reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["pods"]:
                    items = [p for (space, _), p in api.pods.items() if space == parts[3]]
                    return self.reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                if url.path == "/api/v1/nodes":
                    return self.reply(
                        200, {"kind": "NodeList", "apiVersion": "v1", "items": list(api.nodes.values())}
                    )
                if parts[:3] == ["api", "v1", "nodes"]:
                    return self.reply(200, api.nodes[parts[3]])
                if url.path == BAD_PATH:
                    return self.reply(
                        200, {"apiVersion": "gpuweave.io/v1alpha1", "items": list(api.bad.values())}
                    )
            self.reply(404, {"kind": "Status", "code": 404})

        def do_PATCH(self) -> None:
            parts = urlparse(self.path).path.strip("/").split("/")
            assert self.headers["Content-Type"] == "application/strategic-merge-patch+json"
            with api.lock:
                node = api.nodes[parts[3]]
                if api.writes_in_between:  # another writer changed the Node since the client read it
                    api.writes_in_between -= 1
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                patch = self.body()
                wanted = patch.get("metadata", {}).pop("resourceVersion", None)
                if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                    return self.reply(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
                merge(node, patch)
                node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                self.reply(200, node)

        def do_POST(self) -> None:
            path = urlparse(self.path).path
            parts = path.strip("/").split("/")
            body = self.body()
            with api.lock:
                if path.endswith("/eviction"):
                    pod = api.pods.get((parts[3], parts[5]))
                    if pod is None:
                        return self.reply(404, {"kind": "Status", "code": 404})
                    if pod["metadata"].get("labels", {}).get("pdb") == "protected":
                        return self.reply(429, {"kind": "Status", "code": 429, "reason": "TooManyRequests"})
                    uid = body["deleteOptions"].get("preconditions", {}).get("uid")
                    if uid is not None and uid != pod["metadata"]["uid"]:
                        return self.reply(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
                    api.eviction_bodies.append(body)
                    grace = body["deleteOptions"]["gracePeriodSeconds"]
                    api.evictions.append((parts[3], parts[5], grace))
                    return self.reply(201, {"kind": "Status", "code": 201})
                if path.endswith("/events"):
                    api.events.append(body)
                    return self.reply(201, body)
                if path == BAD_PATH:
                    name = body["metadata"]["name"]
                    if name in api.bad:
                        return self.reply(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
                    api.bad[name] = body
                    return self.reply(201, body)
            self.reply(404, {"kind": "Status", "code": 404})

    return Handler


@pytest.fixture
def cluster() -> Iterator[tuple[KubeCluster, ApiState]]:
    api = ApiState()
    for name in ("node-a", "node-b", "node-c"):
        api.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {},
            "status": {},
        }
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(api))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    with client.ApiClient(config) as api_client:
        yield KubeCluster(api_client, node_name="node-a"), api
    server.shutdown()
    server.server_close()
    thread.join()


def add_pod(
    api: ApiState,
    name: str,
    devices: list[str],
    *,
    labels: dict[str, str] | None = None,
    node: str = "node-a",
    annotations: dict[str, str] | None = None,
) -> None:
    assignment = PodAssignment(
        node=node, containers={"main": ContainerAssignment(devices={"nvidia.com/gpu": devices})}
    )
    written = {ANNOTATION_ASSIGNMENT: assignment.to_annotation(), **(annotations or {})}
    pod = pod_body(
        name,
        namespace="ml",
        uid=f"uid-{name}",
        node=node,
        labels=labels,
        annotations=written,
        container="main",
        image="x",
    )
    api.pods[("ml", name)] = {**pod, "status": {"phase": "Running"}}


def test_pods_and_evictions(cluster: tuple[KubeCluster, ApiState]) -> None:
    kube, api = cluster
    add_pod(api, "trainer", ["GPU-5"])
    add_pod(api, "guarded", ["GPU-5"], labels={"pdb": "protected"})
    add_pod(api, "pinned", ["GPU-5"], labels={ANNOTATION_OPT_OUT_EVICTION: "true"})
    add_pod(api, "elsewhere", ["GPU-5"], node="node-b")
    pods = {p.name: p for p in kube.pods_on_node()}
    assert sorted(pods) == ["guarded", "pinned", "trainer"]
    assert pods["trainer"].devices == frozenset({"GPU-5"})
    assert pods["pinned"].opted_out
    assert kube.evict(pods["trainer"], grace_s=120) == EvictionOutcome.EVICTED
    assert api.evictions == [("ml", "trainer", 120)]
    assert kube.evict(pods["guarded"], grace_s=120) == EvictionOutcome.BLOCKED
    del api.pods[("ml", "trainer")]
    assert kube.evict(pods["trainer"], grace_s=120) == EvictionOutcome.GONE


def test_an_eviction_names_the_pods_uid_and_carries_the_agents_label(
    cluster: tuple[KubeCluster, ApiState],
) -> None:
    """What manifests/admission-node-agent.yaml requires of every eviction the agent sends."""
    kube, api = cluster
    add_pod(api, "trainer", ["GPU-5"])
    (pod,) = kube.pods_on_node()
    assert pod.uid == "uid-trainer"
    assert kube.evict(pod, grace_s=30) == EvictionOutcome.EVICTED
    (body,) = api.eviction_bodies
    assert body["metadata"]["labels"] == {EVICTION_LABEL: "true"}
    assert body["deleteOptions"] == {"gracePeriodSeconds": 30, "preconditions": {"uid": "uid-trainer"}}
    add_pod(api, "trainer", ["GPU-5"])
    api.pods[("ml", "trainer")]["metadata"]["uid"] = "uid-another-trainer"  # re-created under the name
    assert kube.evict(pod, grace_s=30) == EvictionOutcome.GONE
    only_the_kubelet_knows = PodRef("ml", "trainer", frozenset({"GPU-5"}))  # no UID: not listed
    assert kube.evict(only_the_kubelet_knows, grace_s=30) == EvictionOutcome.GONE
    assert len(api.eviction_bodies) == 1


def test_pods_without_an_assignment_are_listed_with_no_devices(cluster: tuple[KubeCluster, ApiState]) -> None:
    """Remediation joins the kubelet's pod-resources devices onto these (and keeps the opt-out label)."""
    kube, api = cluster
    add_pod(api, "placed-elsewhere", [], labels={ANNOTATION_OPT_OUT_EVICTION: "true"})
    del api.pods[("ml", "placed-elsewhere")]["metadata"]["annotations"]
    pods = {p.name: p for p in kube.pods_on_node()}
    assert pods["placed-elsewhere"].devices == frozenset()
    assert pods["placed-elsewhere"].opted_out


def test_conditions_keep_transition_time_while_status_holds(cluster: tuple[KubeCluster, ApiState]) -> None:
    kube, api = cluster
    kube.set_conditions((NodeCondition("GpuweaveGpuHealthy", "True", "AllGpusHealthy", ""),))
    first = api.nodes["node-a"]["status"]["conditions"][0]["lastTransitionTime"]
    kube.set_conditions((NodeCondition("GpuweaveGpuHealthy", "True", "AllGpusHealthy", ""),))
    assert api.nodes["node-a"]["status"]["conditions"][0]["lastTransitionTime"] == first
    kube.set_conditions((NodeCondition("GpuweaveGpuHealthy", "False", "GpuFailed", "GPU-5 Failed: Xid 79"),))
    cond = api.nodes["node-a"]["status"]["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "GpuFailed")


def test_taints_counts_and_cordon(cluster: tuple[KubeCluster, ApiState]) -> None:
    kube, api = cluster
    api.nodes["node-b"]["spec"]["taints"] = [{"key": "gpuweave.io/node-fault", "effect": "NoSchedule"}]
    other = {"key": "other", "effect": "NoExecute", "timeAdded": "2026-11-29T17:00:00Z"}
    api.nodes["node-a"]["spec"]["taints"] = [dict(other)]
    assert kube.taint_counts("gpuweave.io/node-fault") == (3, 1, False)
    kube.set_taint("gpuweave.io/node-fault", present=True, value="efa-missing")
    assert kube.taint_counts("gpuweave.io/node-fault") == (3, 2, True)
    taints = api.nodes["node-a"]["spec"]["taints"]
    assert [t["key"] for t in taints] == ["other", "gpuweave.io/node-fault"]
    sent = dict(taints[0])  # sent back as read, its timeAdded too (the admission policy compares them)
    assert datetime.fromisoformat(sent.pop("timeAdded")) == datetime.fromisoformat(other.pop("timeAdded"))
    assert sent == other
    kube.set_taint("gpuweave.io/node-fault", present=False)
    assert [t["key"] for t in api.nodes["node-a"]["spec"]["taints"]] == ["other"]
    kube.set_cordon(True)
    assert api.nodes["node-a"]["spec"]["unschedulable"] is True
    kube.set_cordon(False)
    assert api.nodes["node-a"]["spec"]["unschedulable"] is False
    api.nodes["node-a"]["spec"]["unschedulable"] = True  # an operator's cordon is left alone
    kube.set_cordon(False)
    assert api.nodes["node-a"]["spec"]["unschedulable"] is True


def test_a_node_changed_between_read_and_patch_is_read_again_never_overwritten(
    cluster: tuple[KubeCluster, ApiState],
) -> None:
    """The taint patch carries the resourceVersion it read: a concurrent write is a conflict, the
    agent reads again (a few times), and what the other writer put there stays."""
    kube, api = cluster
    api.writes_in_between = 1
    kube.set_taint("gpuweave.io/health-pending", present=True)
    assert [t["key"] for t in api.nodes["node-a"]["spec"]["taints"]] == ["gpuweave.io/health-pending"]
    api.writes_in_between = NODE_PATCH_ATTEMPTS
    with pytest.raises(ApiException) as refused:
        kube.set_cordon(True)
    assert refused.value.status == 409 and not api.nodes["node-a"]["spec"].get("unschedulable")


def test_events_and_bad_hardware(cluster: tuple[KubeCluster, ApiState]) -> None:
    kube, api = cluster
    kube.post_event(reason="GpuweaveNodeFault", message="efa-missing")
    assert api.events[0]["involvedObject"]["kind"] == "Node"
    entry = BadGpu("GPU-AB-5", "Xid 79 three times", "node-a", "2026-11-29T17:00:00+00:00", 3)
    kube.add_bad_hardware(entry)
    kube.add_bad_hardware(entry)  # 409 is fine: already listed
    assert list(api.bad) == [bad_hardware_name("GPU-AB-5")]
    assert kube.list_bad_hardware() == {"GPU-AB-5": entry}


def test_an_event_naming_a_pods_gang_is_escaped_and_clipped(cluster: tuple[KubeCluster, ApiState]) -> None:
    kube, api = cluster
    gang = "default/gang:g\x1b[2J\u202eexe" + "x" * 5000  # the pod's own annotation, as evictions word it
    pod = PodRef("default", "p", frozenset(), gang=gang)
    kube.post_event(reason="GpuweaveGangEvicted", message=f"evicted with its gang {gang}", pod=pod)
    message = api.events[-1]["message"]
    assert len(message) <= MAX_EVENT_CHARS and "\x1b" not in message and "\u202e" not in message
    assert "gang:g\\x1b[2J\\u202eexe" in message and message.endswith("characters)")


def test_gang_pods_are_found_on_every_node_by_the_gang_their_labels_name(
    cluster: tuple[KubeCluster, ApiState],
) -> None:
    """A JobSet's workers on three nodes, one asking that a fault evict only the pods on the GPU."""
    kube, api = cluster
    jobset = {LABEL_JOBSET_NAME: "js", LABEL_REPLICATED_JOB: "workers", LABEL_JOBSET_RESTART: "2"}
    add_pod(api, "js-0", ["GPU-5"], labels=jobset)
    add_pod(api, "js-1", ["GPU-1"], labels=jobset, node="node-b")
    add_pod(
        api, "js-2", ["GPU-1"], labels=jobset, node="node-c", annotations={ANNOTATION_GANG_EVICTION: "pod"}
    )
    add_pod(api, "solo", ["GPU-2"], node="node-b")
    (mine,) = kube.pods_on_node()
    assert mine.gang == "ml/jobset:js/workers/2" and mine.whole_gang
    members = {p.name: p for p in kube.gang_pods("ml", mine.gang)}
    assert sorted(members) == ["js-0", "js-1", "js-2"]
    assert not members["js-2"].whole_gang
    assert kube.gang_pods("other", mine.gang) == []
