"""The committed v1beta1 stubs match the .proto, and the API surface is the kubelet's."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto import generate
from proto.v1beta1 import api_pb2, api_pb2_grpc


def test_committed_stubs_are_not_stale(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    fresh = generate.generate(tmp_path)
    assert {p.name for p in fresh} >= {"api_pb2.py", "api_pb2_grpc.py"}
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
