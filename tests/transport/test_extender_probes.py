"""The probe listener (``--probe-listen``): health, readiness and metrics only, never a verb."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuweave.simulate.cluster_objects import cluster_list, inventory_object, node_object, profile_inventory
from scheduler_ext.app import Extender, build_snapshot_extender
from tests.transport.test_extender_http import Client


def _snapshot(tmp_path: Path) -> Path:
    inventory = profile_inventory("dgx1-v100", "v100-a")
    path = tmp_path / "cluster.json"
    items = [node_object("v100-a", gpus=8), inventory_object(inventory)]
    path.write_text(json.dumps(cluster_list(items)))
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Extender, str, str]]:
    built = build_snapshot_extender(_snapshot(tmp_path))
    protocol = built.serve(host="127.0.0.1", port=0)
    probes = built.serve_probes(host="127.0.0.1", port=0)
    try:
        yield built, protocol.removeprefix("http://"), probes.removeprefix("http://")
    finally:
        built.close()


def test_probe_port_answers_health_readiness_and_metrics(served: tuple[Extender, str, str]) -> None:
    client = Client(served[2])
    try:
        assert client.get("/healthz") == (200, "ok\n")
        assert client.get("/readyz") == (200, "ok\n")
        status, metrics = client.get("/metrics")
        assert status == 200 and "gpuweave_extender_cached_nodes 1" in metrics
        assert client.get("/filter")[0] == 404
    finally:
        client.close()


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
def test_probe_port_refuses_every_verb(served: tuple[Extender, str, str], verb: str) -> None:
    host, port = served[2].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request("POST", f"/{verb}", body=b'{"Pod": {}}', headers=headers)
        response = connection.getresponse()
        assert response.status == 405
        assert "--listen" in response.read().decode()
    finally:
        connection.close()


def test_readiness_on_the_probe_port_follows_the_cache(served: tuple[Extender, str, str]) -> None:
    extender = served[0]
    extender.cache.synced.clear()
    client = Client(served[2])
    try:
        assert client.get("/readyz")[0] == 503
        assert "gpuweave_extender_ready 0.0" in client.get("/metrics")[1]  # the alert's series
        extender.cache.synced.set()
        assert client.get("/readyz")[0] == 200
        assert "gpuweave_extender_ready 1.0" in client.get("/metrics")[1]
    finally:
        client.close()


def test_cli_serves_probes_on_their_own_port(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "gpuweave", "extender", "--listen", "127.0.0.1:0",
            "--probe-listen", "127.0.0.1:0", "--snapshot", str(_snapshot(tmp_path))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    pipe = subprocess.PIPE
    with subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, env=env) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert "probes on http://127.0.0.1:" in line, line
            probes = line.split("probes on http://", 1)[1].split(" ", 1)[0]
            client = Client(probes)
            try:
                assert client.get("/healthz")[0] == 200
            finally:
                client.close()
        finally:
            process.terminate()
            process.communicate(timeout=30)
