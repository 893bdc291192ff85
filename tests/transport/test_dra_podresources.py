"""DRA mode reads pods' claim devices from the kubelet's pod-resources API (``dynamic_resources``),
so the MIG busy check and health's eviction see DRA pods; over a real unix socket."""

from __future__ import annotations

import shutil
from typing import Any

import grpc

from nodeagent.podresources import AllocationLog, HeldDevices, PodRef, PodResourcesClient
from proto.podresources.v1 import api_pb2
from tests.support.agent_process import short_temp_dir
from tests.support.podresources_server import PodResourcesServer


class KubeletWithClaims(PodResourcesServer):
    """The fake kubelet's List, plus one pod whose container holds two DRA devices of a claim
    (one ours, one another driver's) as the kubelet lists them."""

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = super().List(request, context)
        claim = api_pb2.DynamicResource(
            claim_name="gpus",
            claim_namespace="ml",
            claim_resources=[
                api_pb2.ClaimResource(driver_name="gpuweave.io", pool_name="node-a", device_name="gpu-1"),
                api_pb2.ClaimResource(
                    driver_name="other.example.com", pool_name="node-a", device_name="gpu-1"
                ),
            ],
        )
        container = api_pb2.ContainerResources(name="train", dynamic_resources=[claim])
        response.pod_resources.append(
            api_pb2.PodResources(namespace="ml", name="job-0", containers=[container])
        )
        return response


def test_claim_devices_count_as_held_once_a_resolver_is_set() -> None:
    base = short_temp_dir()
    server = KubeletWithClaims(base / "kubelet.sock")
    server.start()
    try:
        server.admit("ns", "dp-pod", {"c": {"nvidia.com/gpu": ["GPU-0"]}})
        client = PodResourcesClient(server.socket_path)
        assert set(client.list_devices()) == {"GPU-0"}  # device-plugin mode: claims are not ours to read
        ids = {("gpuweave.io", "node-a", "gpu-1"): "GPU-1"}
        client.resolve_dra_with(lambda driver, pool, name: ids.get((driver, pool, name)))
        held = client.list_devices()
        assert held["GPU-1"] == PodRef("ml", "job-0", "train", "claim ml/gpus")
        assert set(held) == {"GPU-0", "GPU-1"}
        assert client.pod_devices()[("ml", "job-0")] == frozenset({"GPU-1"})
        assert HeldDevices(client, AllocationLog())() == frozenset({"GPU-0", "GPU-1"})
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
