"""Degraded NVLink links: what the node agent keeps about pairs its active checks found slow (pure).

An NVLink pair whose peer copies run below threshold (``health.active.judge_links``: e.g. half its
lanes trained, which NVML does not report) is a slow *link*, not two failed GPUs: both GPUs stay in
service for any work that does not span the pair. The agent records the pair as degraded, publishes
it (``status.degradedLinks``, ``devicemodel.degraded``) so the extender's set choice treats it as
the slow link it is, and remembers it across restarts (``health.links_file``). A later check that
measures the pair at its rate clears it.

``next_links`` is the transition: the links now, and which pairs were added or cleared, for the
caller to log (WARNING) and publish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from devicemodel.inventory import DegradedLink, NodeInventory
from health.active import LinkVerdict


@dataclass(frozen=True)
class LinkRecord:
    """One degraded pair, by GPU UUID (sorted), as the agent keeps and persists it."""

    gpus: tuple[str, str]
    fraction: float  # measured / expected copy rate when found
    reason: str

    @property
    def pair(self) -> frozenset[str]:
        return frozenset(self.gpus)


@dataclass(frozen=True)
class LinkChange:
    """What one run's measurements did to the degraded links."""

    links: dict[frozenset[str], LinkRecord]
    added: tuple[LinkRecord, ...] = ()
    cleared: tuple[LinkRecord, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.added or self.cleared)


def record_of(verdict: LinkVerdict) -> LinkRecord:
    a, b = sorted((verdict.src, verdict.dst))
    return LinkRecord((a, b), round(verdict.fraction, 3), verdict.text)


def next_links(
    current: Mapping[frozenset[str], LinkRecord], measured: Mapping[frozenset[str], LinkVerdict]
) -> LinkChange:
    """The degraded links after a run that measured ``measured``: a slow pair is added (a pair
    already degraded keeps its first record), a pair measured at its rate is cleared, a pair not
    measured stays as it was."""
    links = dict(current)
    added, cleared = [], []
    for pair, verdict in sorted(measured.items(), key=lambda item: sorted(item[0])):
        if verdict.slow and pair not in links:
            links[pair] = record_of(verdict)
            added.append(links[pair])
        elif not verdict.slow and pair in links:
            cleared.append(links.pop(pair))
    return LinkChange(links, tuple(added), tuple(cleared))


def inventory_links(records: Iterable[LinkRecord], inventory: NodeInventory) -> tuple[DegradedLink, ...]:
    """The records whose two GPUs are on the node now, by GPU index (what is published)."""
    index = {g.uuid: g.index for g in inventory.gpus}
    return tuple(
        DegradedLink(index[a], index[b], record.fraction, record.reason)
        for record in sorted(records, key=lambda r: r.gpus)
        for a, b in (record.gpus,)
        if a in index and b in index
    )
