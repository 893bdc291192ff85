"""Cluster mode against a real kube-apiserver (tests/e2e/harness): watches, one-call bind, restart.

The extender lists and watches Nodes, GpuNodeInventory objects and Pods through the real
``kubernetes`` client, binds with one Binding that carries the assignment annotation, and
rebuilds its holdings from the annotations after a restart.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import pod_object
from scheduler_ext.app import Extender
from scheduler_ext.kube import KubeBinder, KubeFeed, build_kube_extender
from scheduler_ext.serving.service import BindError
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs
from tests.support.control_plane import ControlPlane, create_gpu_node, harness_binary
from tests.support.raw_pods import api_client as _api
from tests.support.raw_pods import create_pod, read_pod
from tests.support.waiting import wait_until as _wait

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
CRD = ROOT / "manifests" / "crds" / "gpunodeinventories.yaml"
NODES = ("gpu-a", "gpu-b")


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        path = str(plane.admin_kubeconfig)
        _seed(plane)
        yield path
    finally:
        plane.stop()


def _seed(plane: ControlPlane) -> None:
    plane.apply([yaml.safe_load(CRD.read_text())])  # waits until the CRD is established
    with _api(str(plane.admin_kubeconfig)) as api:
        core = client.CoreV1Api(api)  # no controllers run: the default ServiceAccount by hand
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        for name in NODES:
            create_gpu_node(api, name, "p5.48xlarge")


@pytest.fixture
def extender(kubeconfig: str) -> Iterator[Extender]:
    built = build_kube_extender(kubeconfig=kubeconfig)
    try:
        _wait("extender cache sync", built.cache.synced.is_set)
        _wait("inventories", lambda: all(_has_layout(built, n) for n in NODES))
        yield built
    finally:
        built.close()


def _has_layout(extender: Extender, name: str) -> bool:
    state = extender.cache.node(name)
    return state is not None and state.layout is not None


def _create_pod(
    kubeconfig: str, name: str, gpus: int, *, finalizers: list[str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    body = pod_object(name, limits={RESOURCE_GPU: gpus}, **kwargs)
    if finalizers:
        body["metadata"]["finalizers"] = finalizers
    return create_pod(kubeconfig, body)


def _schedule(extender: Extender, pod: dict[str, Any], node: str) -> str:
    args = ExtenderArgs.model_validate({"Pod": pod, "NodeNames": list(NODES)})
    assert node in (extender.service.filter(args, pod).NodeNames or [])
    meta = pod["metadata"]
    return extender.service.bind(
        ExtenderBindingArgs(PodName=meta["name"], PodNamespace="default", PodUID=meta["uid"], Node=node)
    )


def test_bind_is_one_binding_that_lands_the_annotation_and_the_watch_confirms(
    kubeconfig: str, extender: Extender
) -> None:
    pod = _create_pod(kubeconfig, "train-8", 8)
    assert _schedule(extender, pod, "gpu-a") == ""
    stored = read_pod(kubeconfig, "train-8")
    assert stored["spec"]["nodeName"] == "gpu-a"
    assignment = PodAssignment.from_annotation(stored["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
    assert len(assignment.containers["main"].devices[RESOURCE_GPU]) == 8
    uid = pod["metadata"]["uid"]
    _wait("watch confirms the bind", lambda: (h := extender.cache.holding(uid)) is not None and not h.assumed)
    late = _create_pod(kubeconfig, "late", 1)
    _wait("pending pod seen", lambda: extender.cache.pod_object(uid=late["metadata"]["uid"]) is not None)
    error = extender.service.bind(
        ExtenderBindingArgs(
            PodName="late", PodNamespace="default", PodUID=late["metadata"]["uid"], Node="gpu-a"
        )
    )
    assert "no longer fits" in error
    assert ANNOTATION_ASSIGNMENT not in (read_pod(kubeconfig, "late")["metadata"].get("annotations") or {})


def test_refused_binding_leaves_neither_node_nor_annotation(kubeconfig: str, extender: Extender) -> None:
    pod = _create_pod(kubeconfig, "doomed", 2, finalizers=["gpuweave.io/test-hold"])
    uid = pod["metadata"]["uid"]
    with _api(kubeconfig) as api:  # terminating but still present: the API refuses to bind it
        client.CoreV1Api(api).delete_namespaced_pod("doomed", "default")
    _wait(
        "terminating pod seen",
        lambda: (
            ((extender.cache.pod_object(uid=uid) or {}).get("metadata") or {}).get("deletionTimestamp")
            is not None
        ),
    )
    error = extender.service.bind(
        ExtenderBindingArgs(PodName="doomed", PodNamespace="default", PodUID=uid, Node="gpu-b")
    )
    assert "binding pod default/doomed to node gpu-b failed" in error
    stored = read_pod(kubeconfig, "doomed")
    assert ANNOTATION_ASSIGNMENT not in (stored["metadata"].get("annotations") or {})
    assert not stored["spec"].get("nodeName")
    assert extender.cache.holding(uid) is None
    with _api(kubeconfig) as api:
        client.CoreV1Api(api).patch_namespaced_pod("doomed", "default", {"metadata": {"finalizers": None}})


def test_restart_rebuilds_holdings_from_annotations(kubeconfig: str, extender: Extender) -> None:
    pod = _create_pod(kubeconfig, "quad", 4)
    assert _schedule(extender, pod, "gpu-b") == ""
    before = {n: dict(s.holders) for n in NODES if (s := extender.cache.node(n)) is not None}
    extender.close()
    restarted = build_kube_extender(kubeconfig=kubeconfig)
    try:
        _wait("restarted cache sync", restarted.cache.synced.is_set)
        _wait(
            "holdings rebuilt",
            lambda: {n: dict(s.holders) for n in NODES if (s := restarted.cache.node(n))} == before,
        )
        with _api(kubeconfig) as api:
            client.CoreV1Api(api).delete_namespaced_pod("quad", "default", grace_period_seconds=0)
        uid = pod["metadata"]["uid"]
        _wait("delete releases the devices", lambda: restarted.cache.holding(uid) is None)
    finally:
        restarted.close()


def _scheduler_config(directory: Path, *, extender_url: str, kubeconfig: str) -> Path:
    """manifests/scheduler/scheduler-config.yaml, pointed at this extender and API server."""
    shipped = yaml.safe_load((ROOT / "manifests" / "scheduler" / "scheduler-config.yaml").read_text())
    shipped["leaderElection"] = {"leaderElect": False}
    shipped["clientConnection"] = {"kubeconfig": kubeconfig}
    for extender in shipped["extenders"]:
        extender["urlPrefix"] = extender_url
    path = directory / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path


def test_real_kube_scheduler_schedules_through_the_extender(
    kubeconfig: str, extender: Extender, tmp_path: Path
) -> None:
    with _api(kubeconfig) as api:
        core = client.CoreV1Api(api)
        for name in NODES:  # NodeResourcesFit counts nvidia.com/gpu (not ignored): give the nodes 8
            resources = {"cpu": "64", "memory": "512Gi", "pods": "110", RESOURCE_GPU: "8"}
            ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}]
            status = {"capacity": resources, "allocatable": resources, "conditions": ready}
            core.patch_node_status(name, {"status": status})
            core.patch_node(name, {"spec": {"taints": None}})  # the not-ready taint admission added
    url = extender.serve(host="127.0.0.1", port=0)
    config_path = _scheduler_config(
        tmp_path, extender_url=url, kubeconfig=str(Path(kubeconfig).parent / "scheduler.kubeconfig")
    )
    log = (tmp_path / "scheduler.log").open("wb")
    scheduler = subprocess.Popen(
        [str(harness_binary()), "kube-scheduler", f"--config={config_path}", "--secure-port=0"],
        stdout=log,
        stderr=log,
    )
    try:
        pod = _create_pod(kubeconfig, "scheduled", 4)
        uid = pod["metadata"]["uid"]

        def bound() -> bool:
            return bool(read_pod(kubeconfig, "scheduled")["spec"].get("nodeName"))

        try:
            _wait("kube-scheduler binds through the extender", bound, timeout=30)
        except AssertionError:
            raise AssertionError((tmp_path / "scheduler.log").read_text()[-6000:]) from None
        stored = read_pod(kubeconfig, "scheduled")
        assignment = PodAssignment.from_annotation(stored["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
        assert assignment.node == stored["spec"]["nodeName"]
        assert len(assignment.containers["main"].devices[RESOURCE_GPU]) == 4
        _wait("watch confirms", lambda: (h := extender.cache.holding(uid)) is not None and not h.assumed)
    finally:
        scheduler.terminate()
        try:
            scheduler.wait(timeout=30)
        except subprocess.TimeoutExpired:
            scheduler.kill()
            scheduler.wait()
        log.close()


def test_binder_never_annotates_a_recreated_pod(kubeconfig: str) -> None:
    created = _create_pod(kubeconfig, "recreated", 1)
    stale = {**created, "metadata": {**created["metadata"], "uid": "0000-stale-uid"}}
    assignment = PodAssignment(node="gpu-a", containers={})
    refused = pytest.raises(BindError, match=r"binding pod default/recreated to node gpu-a failed: HTTP 409")
    with _api(kubeconfig) as api, refused:
        KubeBinder(api).bind(stale, node="gpu-a", assignment=assignment)
    stored = read_pod(kubeconfig, "recreated")
    assert ANNOTATION_ASSIGNMENT not in (stored["metadata"].get("annotations") or {})
    assert not stored["spec"].get("nodeName")


@pytest.fixture
def compacting_kubeconfig(tmp_path: Path) -> Iterator[str]:
    """A control plane whose watches read etcd directly and which compacts every second, so a
    watch resumed from an old resourceVersion gets 410 Gone."""
    flags = ["--apiserver-arg=--watch-cache=false", "--apiserver-arg=--etcd-compaction-interval=1s"]
    plane = ControlPlane(tmp_path, extra_args=flags)
    try:
        plane.apply([yaml.safe_load(CRD.read_text())])  # waits until the CRD is established
        plane.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        yield str(plane.admin_kubeconfig)
    finally:
        plane.stop()


def test_expired_watch_lists_again_and_keeps_following(compacting_kubeconfig: str) -> None:
    built = build_kube_extender(kubeconfig=compacting_kubeconfig, watch_timeout_s=1)
    try:
        _wait("extender cache sync", built.cache.synced.is_set)
        assert built.cache.node("n1") is not None
        (feed,) = [s for s in built.stoppers if isinstance(s, KubeFeed)]  # the event writer is one too
        nodes = feed.watchers[0]
        assert nodes.relists == 1
        with _api(compacting_kubeconfig) as api:
            core = client.CoreV1Api(api)
            for i in range(20):  # advance etcd's revision past the node watch's resourceVersion
                core.create_namespaced_config_map("default", {"metadata": {"name": f"churn-{i}"}})
            _wait("410 Gone and a relist", lambda: nodes.relists >= 2, timeout=60)
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})
        _wait("the watch resumed after the relist", lambda: built.cache.node("n2") is not None, timeout=30)
    finally:
        built.close()
