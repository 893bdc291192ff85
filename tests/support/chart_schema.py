"""The chart's schema for gpuweave's configuration files, derived from their pydantic models.

``nodeAgent.sharing``, each of ``nodeAgent.sharingConfigs`` and ``nodeAgent.health`` become files
the agent validates with ``devicemodel.sharing.SharingConfigModel`` and ``health.config.HealthConfig``
at start, where a typo stops every agent of the cluster. The chart's ``values.schema.json``
refuses the same typos at render: its definitions ``sharingConfig``, ``healthConfig`` and the
ones they refer to are these models' JSON schema, with what only documents a field (title,
description, default) left out and the references pointing into the chart's ``definitions``.
The fields the chart writes itself (``apiVersion``, ``kind``, ``mpsPipeDirectory``: the MPS pipes
live on the host path the DaemonSet mounts) are not values. ``capacityConfig`` is
``lifecycle.capacity``, the file of ``gpuweave lifecycle --capacity-config``
(``gpuweave.lifecycle.capacity_config.CapacityConfigModel``; the chart writes its ``namespace``).
``tests/unit/test_chart_schema.py`` compares the file with ``chart_definitions()``;
``python -m tests.support.chart_schema`` prints them, to paste after a model changed.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from devicemodel.sharing import SharingConfigModel
from gpuweave.lifecycle.capacity_config import CapacityConfigModel
from health.config import HealthConfig

CHART_OWNED_SHARING_FIELDS = frozenset({"apiVersion", "kind", "mpsPipeDirectory"})
CHART_OWNED_CAPACITY_FIELDS = frozenset({"apiVersion", "kind", "namespace"})
DOCUMENTING_KEYS = frozenset({"title", "description", "default"})


def _cleaned(node: Any, *, prefix: str) -> Any:
    if isinstance(node, list):
        return [_cleaned(item, prefix=prefix) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key in DOCUMENTING_KEYS:
            continue
        if key == "$ref" and isinstance(value, str):
            cleaned[key] = "#/definitions/" + prefix + value.rpartition("/")[2]
        elif key == "properties" and isinstance(value, dict):
            cleaned[key] = {name: _cleaned(field, prefix=prefix) for name, field in value.items()}
        else:
            cleaned[key] = _cleaned(value, prefix=prefix)
    return cleaned


def _definitions(
    model: type[BaseModel], *, root: str, prefix: str, drop: frozenset[str] = frozenset()
) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    nested = schema.pop("$defs", {})
    top = _cleaned(schema, prefix=prefix)
    top["properties"] = {k: v for k, v in top["properties"].items() if k not in drop}
    found = {root: top}
    for name, definition in nested.items():
        found[prefix + name] = _cleaned(definition, prefix=prefix)
    return found


def chart_definitions() -> dict[str, Any]:
    """The definitions ``values.schema.json`` must hold for the agent's configuration files."""
    return {
        **_definitions(
            SharingConfigModel, root="sharingConfig", prefix="sharing.", drop=CHART_OWNED_SHARING_FIELDS
        ),
        **_definitions(HealthConfig, root="healthConfig", prefix="health."),
        **_definitions(
            CapacityConfigModel, root="capacityConfig", prefix="capacity.", drop=CHART_OWNED_CAPACITY_FIELDS
        ),
    }


if __name__ == "__main__":
    print(json.dumps(chart_definitions(), indent=2))
