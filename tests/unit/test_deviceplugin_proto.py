"""The committed stubs (device-plugin v1beta1, pod-resources v1) match their .proto files, and the API
surfaces are the kubelet's."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto import generate
from proto.podresources.v1 import api_pb2 as podresources_pb2
from proto.podresources.v1 import api_pb2_grpc as podresources_pb2_grpc
from proto.v1beta1 import api_pb2, api_pb2_grpc


def test_committed_stubs_are_not_stale(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    fresh = generate.generate(tmp_path)
    fresh_names = {str(p.relative_to(tmp_path)) for p in fresh}
    for package in ("proto/v1beta1", "proto/podresources/v1"):
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            assert f"{package}/api{suffix}" in fresh_names
    for path in fresh:
        committed = generate.REPO_ROOT / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run python -m proto.generate"
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run python -m proto.generate"
        )


def test_package_is_v1beta1_so_method_paths_match_the_kubelet() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert set(services["DevicePlugin"].methods_by_name) == {
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    }
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming is True
    assert hasattr(api_pb2_grpc, "add_DevicePluginServicer_to_server")


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("DevicePluginOptions", {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
        ("RegisterRequest", {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        ("Device", {"ID": 1, "health": 2, "topology": 3}),
        ("NUMANode", {"ID": 1}),
        (
            "ContainerPreferredAllocationRequest",
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        ("ContainerPreferredAllocationResponse", {"deviceIDs": 1}),
        ("ContainerAllocateRequest", {"devices_ids": 1}),
        ("CDIDevice", {"name": 1}),
        (
            "ContainerAllocateResponse",
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        ),
        ("Mount", {"container_path": 1, "host_path": 2, "read_only": 3}),
        ("DeviceSpec", {"container_path": 1, "host_path": 2, "permissions": 3}),
    ],
)
def test_field_numbers_match_the_kubelet_api(message: str, fields: dict[str, int]) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields


def test_podresources_package_is_v1_so_method_paths_match_the_kubelet() -> None:
    service = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert podresources_pb2.DESCRIPTOR.package == "v1"
    assert service.full_name == "v1.PodResourcesLister"
    assert set(service.methods_by_name) == {"List", "GetAllocatableResources", "Get"}
    assert hasattr(podresources_pb2_grpc, "add_PodResourcesListerServicer_to_server")
    assert hasattr(podresources_pb2_grpc, "PodResourcesListerStub")


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("ListPodResourcesResponse", {"pod_resources": 1}),
        ("PodResources", {"name": 1, "namespace": 2, "containers": 3, "cpu_ids": 4, "memory": 5}),
        (
            "ContainerResources",
            {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        ),
        ("ContainerDevices", {"resource_name": 1, "device_ids": 2, "topology": 3}),
        ("ContainerMemory", {"memory_type": 1, "size": 2, "topology": 3}),
        ("TopologyInfo", {"nodes": 1}),
        ("NUMANode", {"ID": 1}),
        ("AllocatableResourcesResponse", {"devices": 1, "cpu_ids": 2, "memory": 3}),
        ("DynamicResource", {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}),
        (
            "ClaimResource",
            {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5},
        ),
        ("GetPodResourcesRequest", {"pod_name": 1, "pod_namespace": 2}),
        ("GetPodResourcesResponse", {"pod_resources": 1}),
    ],
)
def test_podresources_field_numbers_match_the_kubelet_api(message: str, fields: dict[str, int]) -> None:
    descriptor = podresources_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields
