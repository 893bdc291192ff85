"""The ``prioritize-claims`` verb over real HTTP: a snapshot with the agent's own ResourceSlices
(a100-pcie-nvbridge-4: two NVLink pairs) and ResourceClaims, kube-scheduler-shaped JSON in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_GPU
from dradriver.slices import pool_slices
from gpuweave.simulate.cluster_objects import cluster_list, node_object, pod_object
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from scheduler_ext.app import build_snapshot_extender
from tests.transport.test_extender_http import Client

NODES = ["pair-free", "pairs-split", "no-dra"]


def _claim(name: str, count: int, held: list[tuple[str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpuweave.io", "count": count}}
                ]
            }
        },
    }
    if held:
        results = [{"request": "gpus", "driver": "gpuweave.io", "pool": p, "device": d} for p, d in held]
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def _snapshot(tmp_path: Path) -> Path:
    items: list[dict[str, Any]] = []
    for name in ("pair-free", "pairs-split"):
        backend = SimulatedBackend(load_profile("a100-pcie-nvbridge-4"), node_name=name)
        try:
            items += [node_object(name), *pool_slices(backend.discover())]
        finally:
            backend.close()
    items.append(node_object("no-dra"))
    # pair-free: gpu-2 taken (nvl0 whole); pairs-split: gpu-0 and gpu-2 taken (one GPU per pair)
    items.append(_claim("running-a", 1, [("pair-free", "gpu-2")]))
    items.append(_claim("running-b", 2, [("pairs-split", "gpu-0"), ("pairs-split", "gpu-2")]))
    items.append(_claim("pair", 2))
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return path


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    built = build_snapshot_extender(_snapshot(tmp_path))
    built.serve(host="127.0.0.1", port=0)
    assert built.server is not None
    host, port = built.server.server_address[:2]
    made = Client(f"{host!s}:{port}")
    try:
        yield made
    finally:
        made.close()
        built.close()


def _scores(client: Client, pod: dict[str, Any]) -> dict[str, int]:
    status, body = client.post("prioritize-claims", {"Pod": pod, "Nodes": None, "NodeNames": NODES})
    assert status == 200, body
    assert [s["Host"] for s in body] == NODES
    return {s["Host"]: s["Score"] for s in body}


def test_claim_pod_scores_the_node_with_a_whole_nvlink_pair_highest(client: Client) -> None:
    pod = pod_object("trainer")
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "pair"}]
    scores = _scores(client, pod)
    assert scores["pair-free"] > scores["pairs-split"] > 0
    assert scores["no-dra"] == 0


def test_pods_without_claims_of_ours_get_zeros_and_bad_bodies_a_400(client: Client) -> None:
    assert set(_scores(client, pod_object("plain")).values()) == {0}
    assert set(_scores(client, pod_object("device-plugin", limits={RESOURCE_GPU: 2})).values()) == {0}
    status, body = client.post("prioritize-claims", {"Pod": "not a pod"})
    assert status == 400 and body
    status, _ = client.post("prioritize-claims", b"{")
    assert status == 400
