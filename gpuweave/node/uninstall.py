"""``gpuweave uninstall``: every node agent cleans its own node before gpuweave's objects go.

Why this way. A node's leftovers are partly on the host (CDI specs, sockets, state), so something
must run on every node the agent ran on, with the agent's host paths and privileges, while the
agent's RBAC and token still exist. Helm cannot run a pod per node: a hook Job's pod count is fixed
when the chart is rendered (at install, not at uninstall), and a hook DaemonSet is not waited for.
A SIGTERM handler in the agent cannot tell an uninstall from a restart or an upgrade, and by the
time the DaemonSet's deletion reaches the pods Helm has deleted the RBAC and the service account
(their tokens stop working). So the chart's pre-delete hook (a Job, which Helm waits for) runs
this, before anything is deleted:

1. The agent DaemonSet's pod template becomes the cleanup: an init container
   ``node-agent <the agent's flags> --cleanup`` (retried by the kubelet until it succeeds) and a
   container that waits (``--cleanup --then-wait``), all at once (``maxUnavailable: 100%``).
   The DaemonSet controller stops each agent (its normal SIGTERM stop) and starts the cleanup
   with the same host paths, privileges and node-bound token, so admission-node-agent.yaml still
   holds each to its own node.
2. Wait until every scheduled pod of the new template is Ready, that is, its cleanup succeeded.
3. A sweep over the API for what no agent reached (a node whose pod never became Ready, a node
   unlabelled since): the agent's labels, taints, annotation, cordon and conditions, and every
   GpuNodeInventory. Such nodes are named: their host state needs ``node-agent --cleanup`` there.

Then Helm deletes the release's objects; the waiting containers exit on SIGTERM. Running pods keep
their devices throughout (a device plugin going away does not stop containers).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UNINSTALL_ANNOTATION = "gpuweave.io/uninstall"
AGENT_CONTAINER = "node-agent"
CLEANUP_CONTAINER = "cleanup"
_NOT_FOR_CLEANUP = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle")


def agent_container(template: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's container in a DaemonSet's pod template (named ``node-agent``, else the one
    whose arguments start with ``node-agent``)."""
    containers = template.get("spec", {}).get("containers") or []
    for container in containers:
        if container.get("name") == AGENT_CONTAINER:
            return dict(container)
    for container in containers:
        if (container.get("args") or [None])[0] == "node-agent":
            return dict(container)
    raise ValueError(
        f"no node-agent container in the DaemonSet's pod template ({len(containers)} containers)"
    )


def is_cleanup(template: Mapping[str, Any]) -> bool:
    return (template.get("metadata", {}).get("annotations") or {}).get(UNINSTALL_ANNOTATION) == "true"


def cleanup_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The agent DaemonSet's pod template turned into the cleanup (see the module docstring); a
    template that already is one comes back unchanged (the hook may run twice)."""
    if is_cleanup(template):
        return copy.deepcopy(dict(template))
    agent = agent_container(template)
    args = [a for a in agent.get("args") or [] if a not in ("--cleanup", "--then-wait")]
    base = {k: copy.deepcopy(v) for k, v in agent.items() if k not in _NOT_FOR_CLEANUP}
    init = {**base, "name": CLEANUP_CONTAINER, "args": [*args, "--cleanup"]}
    wait = {**base, "args": [*args, "--cleanup", "--then-wait"]}
    new = copy.deepcopy(dict(template))
    metadata = new.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), UNINSTALL_ANNOTATION: "true"}
    new["spec"]["initContainers"] = [init]
    new["spec"]["containers"] = [wait]
    return new


def cleanup_daemonset(daemonset: Mapping[str, Any]) -> dict[str, Any]:
    """The whole DaemonSet with the cleanup template, rolled out on every node at once."""
    new = copy.deepcopy(dict(daemonset))
    new["spec"]["template"] = cleanup_template(daemonset["spec"]["template"])
    new["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}
    new.pop("status", None)
    return new


@dataclass(frozen=True)
class Rollout:
    """How far the cleanup DaemonSet has come (from its status)."""

    desired: int
    updated: int
    ready: int
    current_generation: bool

    @property
    def done(self) -> bool:
        return self.current_generation and self.updated == self.desired and self.ready >= self.desired

    def describe(self) -> str:
        return f"{self.ready} of {self.desired} nodes cleaned ({self.updated} pods started)"


def rollout(daemonset: Mapping[str, Any]) -> Rollout:
    status = daemonset.get("status") or {}
    generation = (daemonset.get("metadata") or {}).get("generation") or 0
    return Rollout(
        desired=int(status.get("desiredNumberScheduled") or 0),
        updated=int(status.get("updatedNumberScheduled") or 0),
        ready=int(status.get("numberReady") or 0),
        current_generation=int(status.get("observedGeneration") or 0) >= int(generation),
    )


def cleaned_nodes(pods: list[Mapping[str, Any]]) -> set[str]:
    """The nodes whose cleanup pod is Ready (its init container, the cleanup, succeeded)."""
    nodes = set()
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if not is_cleanup(pod) or metadata.get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            nodes.add(str((pod.get("spec") or {}).get("nodeName")))
    return nodes
