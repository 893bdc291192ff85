"""Kubernetes label selectors (``matchLabels`` + ``matchExpressions``), evaluated as the API does.

Used to find the PodDisruptionBudgets over a pod. A selector that does not parse selects nothing
(the API server refuses such a selector on a PDB; one that slipped through must not widen it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether ``selector`` selects an object with ``labels``. ``None`` selects nothing (a PDB
    without a selector covers no pod); an empty selector selects everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_expression(e, labels) for e in selector.get("matchExpressions") or [])


def _expression(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expression.get("key")
    operator = expression.get("operator")
    values = expression.get("values") or []
    if not isinstance(key, str):
        return False
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False
