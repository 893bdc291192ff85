"""The few kube-scheduler filters ``--explain`` applies before asking the extender's core.

kube-scheduler sends the extender only the nodes its own plugins let through, so a node behind a
taint the pod does not tolerate, or outside its nodeSelector, is never the extender's to judge.
``--explain`` runs outside kube-scheduler; it applies the plugins whose verdict follows from the
objects alone (NodeUnschedulable, TaintToleration, NodeAffinity's nodeSelector part), so the
nearest node it names is one kube-scheduler would consider, and says so in kube-scheduler's words.
Everything else (resources, affinity terms, volumes) stays kube-scheduler's: its own last message
(the pod's PodScheduled condition) is shown beside gpuweave's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def excluded_by_scheduler(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why kube-scheduler's own filters keep ``pod`` off ``node`` (its wording), or None."""
    spec = _mapping(pod.get("spec"))
    node_spec = _mapping(node.get("spec"))
    tolerations = [_mapping(t) for t in spec.get("tolerations") or []]
    if node_spec.get("unschedulable") and not any(
        _tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in tolerations
    ):
        return "node(s) were unschedulable"
    for taint in (_mapping(t) for t in node_spec.get("taints") or []):
        if taint.get("effect") in FILTERED_EFFECTS and not any(_tolerates(t, taint) for t in tolerations):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    selector = _mapping(spec.get("nodeSelector"))
    if any(labels.get(key) != value for key, value in selector.items()):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """v1 toleration matching: an empty key with Exists matches every taint, an empty effect every effect."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
