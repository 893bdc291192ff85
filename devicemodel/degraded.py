"""The wire form of degraded NVLink pairs: a GpuNodeInventory's ``status.degradedLinks``.

The node agent publishes each NVLink pair its active checks measured below threshold
(``inventory.DegradedLink``) as ``{"gpus": [a, b], "fraction": 0.5, "reason": "..."}`` (GPU
indices, the share of the modelled bandwidth the pair kept); the scheduler extender reads them back
onto the node's inventory. Reading is tolerant: an inventory written before the field existed has
none, and an entry that does not parse is skipped (and named) rather than failing the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from devicemodel.inventory import DegradedLink

STATUS_FIELD = "degradedLinks"


def links_to_wire(links: Iterable[DegradedLink]) -> list[dict[str, Any]]:
    """Entries sorted by pair, the fraction rounded to 3 places (a re-measure that moves it in the
    fourth does not rewrite the object)."""
    entries = []
    for link in sorted(links, key=lambda item: (min(item.gpu_a, item.gpu_b), max(item.gpu_a, item.gpu_b))):
        entry: dict[str, Any] = {
            "gpus": sorted((link.gpu_a, link.gpu_b)),
            "fraction": round(link.fraction, 3),
        }
        if link.reason:
            entry["reason"] = link.reason
        entries.append(entry)
    return entries


def links_from_wire(raw: object) -> tuple[tuple[DegradedLink, ...], list[str]]:
    """(links, problems): the entries that parse, and one line per entry that does not."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        return (), [f"{STATUS_FIELD} is not a list"]
    links, problems = [], []
    for position, entry in enumerate(raw):
        link = _one(entry)
        if link is None:
            problems.append(f"{STATUS_FIELD}[{position}] is not {{gpus: [a, b], fraction: 0..1}}: {entry!r}")
        else:
            links.append(link)
    return tuple(links), problems


def _one(entry: object) -> DegradedLink | None:
    if not isinstance(entry, dict):
        return None
    gpus, fraction = entry.get("gpus"), entry.get("fraction")
    if (
        not isinstance(gpus, list)
        or len(gpus) != 2
        or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
        or gpus[0] == gpus[1]
        or not isinstance(fraction, int | float)
        or isinstance(fraction, bool)
        or not 0.0 <= float(fraction) <= 1.0
    ):
        return None
    return DegradedLink(int(gpus[0]), int(gpus[1]), float(fraction), str(entry.get("reason") or ""))
