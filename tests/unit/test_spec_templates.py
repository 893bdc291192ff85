"""One full parse per hardware shape: later specs of the shape give what a full parse gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from devicemodel.errors import InvalidInputError
from devicemodel.spec import NodeProfileSpec
from devicemodel.spec_templates import SpecTemplates
from gpuweave.simulate.cluster_objects import profile_inventory, unique_uuids
from nodeagent.published import inventory_object


def _spec(profile: str, name: str) -> dict[str, Any]:
    inventory = unique_uuids(profile_inventory(profile, name), salt=name)
    spec: dict[str, Any] = orjson.loads(orjson.dumps(inventory_object(inventory)["spec"]))
    return spec


def _full(spec: dict[str, Any], name: str) -> Any:
    return NodeProfileSpec.parse(spec).to_inventory(node_name=name)


@pytest.mark.parametrize("profile", ["dgx-h100", "p5.48xlarge", "dgx1-v100"])
def test_a_second_node_of_a_shape_reuses_the_parse_and_equals_a_full_parse(profile: str) -> None:
    templates = SpecTemplates()
    first, second = _spec(profile, "node-a"), _spec(profile, "node-b")
    assert first["gpus"][0]["uuid"] != second["gpus"][0]["uuid"]
    inv_a = templates.inventory(first, name="node-a", source="a")
    inv_b = templates.inventory(second, name="node-b", source="b")
    assert (templates.misses, templates.hits) == (1, 1)  # one shape: the second reused the first
    assert inv_a == _full(first, "node-a")
    assert inv_b == _full(second, "node-b")
    assert inv_b.name == "node-b"


def test_mig_devices_get_their_own_uuids_and_parents() -> None:
    templates = SpecTemplates()
    specs = []
    for name in ("m-a", "m-b"):
        spec = _spec("dgx-a100", name)
        spec["gpus"][0]["migEnabled"] = True
        spec["migDevices"] = [
            {"gpu": 0, "uuid": f"MIG-{name.encode().hex()}-0000-4000-8000-000000000001", "profile": "1g.10gb",
             "gpuInstanceId": 9, "computeInstanceId": 0, "placementStart": 0, "placementSize": 1,
             "memoryMiB": 9856, "computeSlices": 1}
        ]
        specs.append(spec)
    templates.inventory(specs[0], name="m-a", source="a")
    inventory = templates.inventory(specs[1], name="m-b", source="b")
    assert templates.hits == 1
    assert inventory == _full(specs[1], "m-b")
    assert inventory.mig_devices[0].parent_uuid == inventory.gpus[0].uuid


def test_another_shape_is_parsed_in_full() -> None:
    templates = SpecTemplates()
    templates.inventory(_spec("dgx-h100", "a"), name="a", source="a")
    other = _spec("dgx-h100", "b")
    other["driverVersion"] = "999.1"
    inventory = templates.inventory(other, name="b", source="b")
    assert (templates.misses, templates.hits) == (2, 0)
    assert inventory.driver_version == "999.1"


@pytest.mark.parametrize("breakage", ["duplicate", "malformed"])
def test_bad_uuids_on_a_known_shape_fail_as_the_full_parse_does(breakage: str) -> None:
    templates = SpecTemplates()
    templates.inventory(_spec("dgx-h100", "a"), name="a", source="spec of a")
    bad = _spec("dgx-h100", "b")
    bad["gpus"][1]["uuid"] = bad["gpus"][0]["uuid"] if breakage == "duplicate" else "GPU-zz"
    with pytest.raises(InvalidInputError) as memo_error:
        templates.inventory(bad, name="b", source="spec of b")
    with pytest.raises(InvalidInputError) as full_error:
        NodeProfileSpec.parse(bad, source="spec of b")
    assert str(memo_error.value) == str(full_error.value)
    assert templates.hits == 0
