"""Short summaries of extender decisions, shared by ``gpuweave status --explain`` and pod Events.

kube-scheduler's FailedScheduling message counts equal reasons across nodes ("0/5 nodes are
available: 3 Insufficient cpu ..."); operators read gpuweave's answer in the same form, so an
Event and ``--explain`` say the same thing for the same decision. The extender's reasons are
written per node and a few name the node; ``reason_counts`` takes the node's own name out, so
equal reasons count together. Devices are named as an operator finds them on the node (GPU
index, MIG profile and parent), not by UUID: a line of eight GPU UUIDs fits no terminal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from devicekinds.kind import DeviceNames, DeviceText
from devicekinds.registry import KINDS
from devicemodel.assignment import PodAssignment
from scheduler_ext.decide.state import NodeState

MAX_MESSAGE = 1000  # an Event message is meant to be read in `kubectl describe`, not to be a report


@dataclass(frozen=True)
class DeviceGroup:
    """One container's devices of one resource, in words (``GPUs 0,1,2,3``, ``40% compute of GPU 7``)."""

    container: str
    resource: str
    text: str
    gpu_indices: tuple[int, ...] = ()  # whole GPUs only: what the topology score is about


def generic_reason(node: str, reason: str) -> str:
    """The reason with the node's own name taken out, so equal reasons of two nodes are equal."""
    return reason.replace(f"node {node} ", "the node ")


def reason_counts(rejected: Iterable[tuple[str, str]]) -> list[tuple[str, int]]:
    """(reason, nodes) from (node, reason) pairs, most common first (then alphabetical)."""
    counts = Counter(generic_reason(node, reason) for node, reason in rejected)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def rejection_message(total: int, counts: Sequence[tuple[str, int]], *, available: int = 0) -> str:
    """``0/5 nodes are available: 3 node(s): <reason>. 2 node(s): <reason>.`` (kube-scheduler's form)."""
    groups = " ".join(f"{count} node(s): {reason}." for reason, count in counts)
    return shorten(f"{available}/{total} nodes are available: {groups}".rstrip())


def shorten(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def device_groups(assignment: PodAssignment, state: NodeState | None) -> list[DeviceGroup]:
    """The assignment's devices per container and resource, named by index on ``state``'s node,
    in its resource kind's words (``ResourceKind.describe``)."""
    names = _names(state)
    groups = []
    for container, chosen in sorted(assignment.containers.items()):
        for resource, ids in sorted(chosen.devices.items()):
            kind = KINDS.kind_for(resource)
            said = (
                kind.describe(resource, ids, names)
                if kind
                else DeviceText(f"{resource} " + ",".join(sorted(ids)))
            )
            groups.append(DeviceGroup(container, resource, said.text, said.gpu_indices))
    return groups


def placement_text(node: str, groups: Sequence[DeviceGroup]) -> str:
    """``node X: GPUs 0,1,2,3; EFA efa_0`` (containers named when the pod has several)."""
    several = len({g.container for g in groups}) > 1
    parts = [f"{g.container}: {g.text}" if several else g.text for g in groups]
    return f"node {node}: " + ("; ".join(parts) if parts else "no devices")


def _names(state: NodeState | None) -> DeviceNames:
    """GPU UUID -> index and MIG UUID -> ``MIG 1g.10gb on GPU 2`` for the node's layout."""
    if state is None or state.layout is None or state.index is None:
        return DeviceNames()
    gpu_index = {uuid: index for index, uuid in state.index.gpu_uuids.items()}
    uuids = state.index.mig_uuids
    migs = {uuids[m.position]: f"MIG {m.profile} on GPU {m.parent_index}" for m in state.layout.migs}
    return DeviceNames(gpu_index=gpu_index, mig_names=migs)
