"""The chart's schema for the node agent's configuration files is their pydantic models' schema,
so a value the agent would refuse at start (a typo under nodeAgent.health or nodeAgent.sharing)
is refused at render instead, and the two cannot drift apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.chart_schema import chart_definitions

SCHEMA = Path(__file__).resolve().parents[2] / "manifests" / "helm" / "gpuweave" / "values.schema.json"


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text())
    return loaded


def test_the_charts_definitions_are_the_config_models_schema() -> None:
    definitions = _schema()["definitions"]
    for name, expected in chart_definitions().items():
        assert definitions.get(name) == expected, (
            f"values.schema.json definitions[{name!r}] differs from the pydantic model's schema; "
            f"paste it from `python -m tests.support.chart_schema`:\n{json.dumps(expected)}"
        )


def test_the_agents_config_values_use_those_definitions_and_are_closed() -> None:
    agent = _schema()["properties"]["nodeAgent"]["properties"]
    assert agent["sharing"] == {"$ref": "#/definitions/sharingConfig"}
    assert agent["health"] == {"$ref": "#/definitions/healthConfig"}
    assert agent["sharingConfigs"]["additionalProperties"] == {"$ref": "#/definitions/sharingConfig"}
    for name, definition in chart_definitions().items():
        if definition.get("type") == "object" and "properties" in definition:
            assert definition["additionalProperties"] is False, name


def test_a_model_field_left_out_of_the_chart_is_found() -> None:
    """The comparison fails where it should: a field the models have and the file lacks."""
    definitions = _schema()["definitions"]
    trimmed = json.loads(json.dumps(definitions["healthConfig"]))
    del trimmed["properties"]["strike_limit"]
    assert trimmed != chart_definitions()["healthConfig"]


def test_the_lifecycle_capacity_value_is_the_capacity_config_model_and_closed() -> None:
    lifecycle = _schema()["properties"]["lifecycle"]
    assert lifecycle["additionalProperties"] is False
    assert lifecycle["properties"]["capacity"] == {"$ref": "#/definitions/capacityConfig"}
    assert "namespace" not in _schema()["definitions"]["capacityConfig"]["properties"]  # the chart's
