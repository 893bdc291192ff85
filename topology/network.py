"""Network tiers between nodes, from the node labels clouds and the GPU operator already set.

A tier is one node label; two nodes in the same tier domain carry the same value for it. The
tiers are ordered closest-to-the-node first, so the lowest tier index a set of nodes shares names
the tightest network domain that holds them all, and a lower index means fewer switch hops
between them (docs/extender.md, Gangs: gangs are placed by network tier).

Default order, closest first:

- ``nvidia.com/gpu.clique``: the NVLink domain (multi-node NVLink, GB200 NVL72), set by the GPU
  operator's feature discovery; nodes in one clique reach each other over NVLink.
- ``topology.k8s.aws/network-node-layer-3`` .. ``-1``: the EC2 instance topology as EKS labels it.
  Layer 1 is the top of the hierarchy (the broadest grouping), layer 3 the bottom layer for most
  instance types, so nodes sharing a layer-3 value are physically closest (EKS user guide, "Place
  distributed AI/ML workloads with network topology labels"; EC2 user guide, "How Amazon EC2
  instance topology works").
- ``cloud.google.com/gce-topology-subblock``, ``cloud.google.com/gce-topology-block``: GKE's
  compact-placement labels, sub-block inside block.

Pure: no I/O, and no dependency on how labels reach the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from devicemodel.errors import InvalidInputError

LABEL_GPU_CLIQUE: Final = "nvidia.com/gpu.clique"
LABEL_AWS_LAYER_1: Final = "topology.k8s.aws/network-node-layer-1"
LABEL_AWS_LAYER_2: Final = "topology.k8s.aws/network-node-layer-2"
LABEL_AWS_LAYER_3: Final = "topology.k8s.aws/network-node-layer-3"
LABEL_GKE_SUBBLOCK: Final = "cloud.google.com/gce-topology-subblock"
LABEL_GKE_BLOCK: Final = "cloud.google.com/gce-topology-block"

DEFAULT_TIER_LABELS: Final[tuple[str, ...]] = (
    LABEL_GPU_CLIQUE,
    LABEL_AWS_LAYER_3,
    LABEL_AWS_LAYER_2,
    LABEL_AWS_LAYER_1,
    LABEL_GKE_SUBBLOCK,
    LABEL_GKE_BLOCK,
)


def lowest_common_tier(
    label_maps: Sequence[Mapping[str, str]], *, tier_labels: Sequence[str] = DEFAULT_TIER_LABELS
) -> int:
    """Index in ``tier_labels`` of the closest tier every node shares one value of.

    A node that lacks a tier's label shares no domain at that tier. ``len(tier_labels)`` means the
    nodes share no labelled tier (they meet only beyond every tier, e.g. across the spine), so the
    result orders placements directly: lower is tighter. One node gives the first tier it carries.
    """
    if not label_maps:
        raise InvalidInputError("lowest_common_tier needs at least one node's labels, got none")
    for index, label in enumerate(tier_labels):
        values = {labels.get(label) for labels in label_maps}
        if len(values) == 1 and None not in values:
            return index
    return len(tier_labels)


def tier_domain(
    labels: Mapping[str, str], tier: int, *, tier_labels: Sequence[str] = DEFAULT_TIER_LABELS
) -> str | None:
    """The node's domain at ``tier`` (its label value), None when it carries no such label.

    Nodes with equal non-None domains at a tier share that tier; ``tier == len(tier_labels)`` is the
    whole cluster, one domain (``""``).
    """
    if tier == len(tier_labels):
        return ""
    if not 0 <= tier < len(tier_labels):
        raise InvalidInputError(
            f"tier {tier} is outside 0..{len(tier_labels)} for {len(tier_labels)} tier labels"
        )
    return labels.get(tier_labels[tier])


def tier_name(tier: int, *, tier_labels: Sequence[str] = DEFAULT_TIER_LABELS) -> str:
    """The label a tier index stands for, ``"cluster"`` past the last one (for reports)."""
    return tier_labels[tier] if 0 <= tier < len(tier_labels) else "cluster"


def parse_tier_labels(text: str) -> tuple[str, ...]:
    """A comma-separated tier list (closest first), as a flag or config value gives it."""
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    if not labels:
        raise InvalidInputError(
            f"tier label list {text!r} names no label; give e.g. {','.join(DEFAULT_TIER_LABELS[:2])}"
        )
    if len(set(labels)) != len(labels):
        raise InvalidInputError(f"tier label list {text!r} names a label twice")
    return labels


def group_by_domain(
    nodes: Iterable[tuple[str, Mapping[str, str]]],
    tier: int,
    *,
    tier_labels: Sequence[str] = DEFAULT_TIER_LABELS,
) -> dict[str, list[str]]:
    """Node names grouped by their domain at ``tier``; nodes without the tier's label are left out."""
    groups: dict[str, list[str]] = {}
    for name, labels in nodes:
        domain = tier_domain(labels, tier, tier_labels=tier_labels)
        if domain is not None:
            groups.setdefault(domain, []).append(name)
    return groups
