"""API connections are reused against the real kube-apiserver (tests/e2e/harness).

The extender's binds and Event writes read raw answers (``_preload_content=False``); an answer
left unread keeps its connection, so every call opened a new TLS connection (a handshake on both
sides per bind). ``kubeio.client.finish`` reads the answer and hands the connection back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpuweave.simulate.cluster_objects import pod_object
from kubeio.client import api_client
from scheduler_ext.kube import KubeBinder
from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.e2e
BINDS = 6


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    started = ControlPlane(Path(tmp_path_factory.mktemp("control-plane")))
    try:
        yield started
    finally:
        started.stop()


def _connections_made(api: client.ApiClient) -> int:
    pool = api.rest_client.pool_manager.connection_from_url(api.configuration.host)
    made: int = pool.num_connections
    return made


def _pending_pod(core: Any, name: str) -> dict[str, Any]:
    body = pod_object(name, limits={})
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        body["metadata"].pop(key)
    body.pop("status")
    created: dict[str, Any] = json.loads(
        core.create_namespaced_pod("default", body, _preload_content=False).data
    )
    return created


def test_binds_in_a_row_reuse_one_connection(plane: ControlPlane) -> None:
    with api_client(plane.admin_kubeconfig) as admin:
        core: Any = client.CoreV1Api(admin)
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})  # no controllers
        pods = [_pending_pod(core, f"reuse-{i}") for i in range(BINDS)]
        with api_client(plane.admin_kubeconfig) as api:
            binder = KubeBinder(api)
            for pod in pods:
                binder.bind(pod, node="gpu-a", assignment=None)
            made = _connections_made(api)
        bound = [core.read_namespaced_pod(p["metadata"]["name"], "default").spec.node_name for p in pods]
    assert bound == ["gpu-a"] * BINDS
    assert made == 1, f"{BINDS} binds in a row opened {made} connections"
