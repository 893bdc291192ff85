"""Published objects: the GpuNodeInventory and node labels, as `gpuweave publish` prints them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.spec import NodeProfileSpec
from gpuweave.cli import main
from hardware.profiles import builtin_profile_names, load_profile
from nodeagent.published import inventory_object, label_value, node_labels, topology_shape
from scheduler_ext.cluster.objects import inventory_record
from tests.support.small_inventory import gpu_uuid, small_inventory

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "gpunodeinventories.yaml"


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["group"] == "gpuweave.io" and crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["plural"] == "gpunodeinventories"
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def assert_fits(value: Any, schema: dict[str, Any], where: str = "") -> None:
    """A small structural check of a value against an OpenAPI v3 schema (types and known fields)."""
    if value is None:
        assert schema.get("nullable"), f"{where} is null"
        return
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), where
        props = schema.get("properties")
        if props is None and "additionalProperties" not in schema:
            return  # free-form object (metadata)
        for key, item in value.items():
            sub = props.get(key) if props is not None else schema.get("additionalProperties")
            assert sub is not None, f"{where}.{key} is not in the CRD schema"
            assert_fits(item, sub, f"{where}.{key}")
    elif kind == "array":
        assert isinstance(value, list), where
        for i, item in enumerate(value):
            assert_fits(item, schema["items"], f"{where}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int), where
    elif kind == "string":
        assert isinstance(value, str), where
        assert value in schema.get("enum", [value]), where
    elif kind == "boolean":
        assert isinstance(value, bool), where


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_publish_prints_inventory_and_labels_that_fit_the_crd(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["publish", "--simulate", profile, "--node-name", "node-7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["kind"] == "List"
    inventory_cr, node = printed["items"]
    assert inventory_cr["kind"] == "GpuNodeInventory" and inventory_cr["metadata"]["name"] == "node-7"
    assert_fits(inventory_cr, crd_schema())
    expected = load_profile(profile).to_inventory(node_name="node-7")
    spec = NodeProfileSpec.parse(inventory_cr["spec"])
    assert spec.to_inventory(node_name="node-7") == expected
    assert inventory_record(inventory_cr).inventory == expected  # the extender reads it back
    assert node["kind"] == "Node" and node["metadata"]["name"] == "node-7"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == str(len(expected.gpus))


def test_labels_follow_gfd_names() -> None:
    labels = node_labels(small_inventory())
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.memory"] == "81920"
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["nvidia.com/cuda.driver-version.major"] == "550"
    assert labels["nvidia.com/cuda.driver.major"] == "550"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["gpuweave.io/topology"] == "nvlink-4"
    assert all(len(v) <= 63 for v in labels.values())


def test_label_value_is_kubernetes_safe() -> None:
    assert label_value("NVIDIA H100 80GB HBM3 (SXM)") == "NVIDIA-H100-80GB-HBM3-SXM"
    assert len(label_value("x" * 80)) == 63


def test_topology_shape_names() -> None:
    assert topology_shape(load_profile("dgx-h100").to_inventory()) == "nvswitch-8"
    assert topology_shape(load_profile("dgx1-v100").to_inventory()) == "nvlink-8"
    assert topology_shape(load_profile("l40s-pcie-8").to_inventory()) == "pcie-8"


def test_status_carries_health_fanned_out_to_mig_and_withheld() -> None:
    inventory = small_inventory(mig_on=(1,))
    obj = inventory_object(inventory, faults={gpu_uuid(1): "Xid 79"}, withheld={gpu_uuid(3): "suspect"})
    status = obj["status"]
    unhealthy = set(status["unhealthyDevices"])
    assert gpu_uuid(1) in unhealthy and gpu_uuid(3) in unhealthy
    assert {m.uuid for m in inventory.mig_devices} <= unhealthy
    assert gpu_uuid(0) not in unhealthy
    assert status["withheld"] == [gpu_uuid(3)]
    assert inventory_record(obj).unhealthy == frozenset(unhealthy)
