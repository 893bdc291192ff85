"""The wire form of degraded NVLink pairs: a GpuNodeInventory's ``status.degradedLinks``.

The node agent publishes each NVLink pair its active checks measured below threshold
(``inventory.DegradedLink``) as ``{"gpus": [a, b], "fraction": 0.5, "reason": "..."}`` (GPU
indices, the share of the modelled bandwidth the pair kept); the scheduler extender reads them back
onto the node's inventory. Reading is tolerant: an inventory written before the field existed has
none, and an entry that does not parse is skipped (and named) rather than failing the node.

Each entry is read through ``DegradedLinkEntry`` with the CRD's bounds
(``manifests/crds/gpunodeinventories.yaml``): two distinct GPU indices below ``spec.MAX_GPUS``, a
finite fraction in 0..1, a reason of at most ``MAX_REASON`` characters; strict types (no ``true``
for 1, no ``"0.5"`` for 0.5). Fields it does not know are ignored: a newer agent's, read by an
older extender during a rolling upgrade. A list longer than the CRD's ``maxItems`` is not read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from devicemodel.errors import clip
from devicemodel.inventory import DegradedLink
from devicemodel.spec import MAX_GPUS
from devicemodel.validation import first_problem

STATUS_FIELD = "degradedLinks"
MAX_LINKS = 512  # the CRD's maxItems
MAX_REASON = 1024  # the CRD's maxLength of one reason

G = TypeVar("G")
T = TypeVar("T")
K = TypeVar("K", int, str)  # a GPU as an entry names it: index (status) or UUID (state file)


def _two_gpus(gpus: list[G]) -> list[G]:
    if gpus[0] == gpus[1]:
        raise ValueError("names one GPU twice; a link joins two GPUs")
    return gpus


class LinkEntry(BaseModel, Generic[G]):
    """A degraded link wherever it is read (here by GPU index, in the agent's state file by GPU
    UUID): two distinct GPUs, the finite share of the rate kept, a bounded reason (null: none)."""

    model_config = ConfigDict(frozen=True, strict=True)

    gpus: Annotated[list[G], Field(min_length=2, max_length=2), AfterValidator(_two_gpus)]
    fraction: float = Field(ge=0, le=1, allow_inf_nan=False)
    reason: str | None = Field(default=None, max_length=MAX_REASON)


GpuIndex = Annotated[int, Field(ge=0, lt=MAX_GPUS)]


class DegradedLinkEntry(LinkEntry[GpuIndex]):
    """One entry of ``status.degradedLinks``, as the CRD has it."""

    model_config = ConfigDict(extra="ignore")

    def link(self) -> DegradedLink:
        return DegradedLink(self.gpus[0], self.gpus[1], self.fraction, self.reason or "")


def slowest_entries(
    links: Iterable[T],
    *,
    limit: int,
    fraction: Callable[[T], float],
    gpus: Callable[[T], Sequence[K]],
    reason: Callable[[T], str | None],
) -> list[dict[str, Any]]:
    """Degraded links as ``LinkEntry`` dicts, for the status field and the agent's state file alike:
    past ``limit`` links only the slowest (what a reader acts on first), sorted by GPU pair, each
    reason clipped to ``MAX_REASON`` (omitted where ``reason`` gives None), so what is written
    always reads back."""
    kept = sorted(links, key=fraction)[:limit]
    entries = []
    for link in sorted(kept, key=lambda item: sorted(gpus(item))):
        entry: dict[str, Any] = {"gpus": sorted(gpus(link)), "fraction": fraction(link)}
        text = reason(link)
        if text is not None:
            entry["reason"] = clip(text, limit=MAX_REASON)
        entries.append(entry)
    return entries


def links_to_wire(links: Iterable[DegradedLink]) -> list[dict[str, Any]]:
    """Entries sorted by pair, the fraction rounded to 3 places (a re-measure that moves it in the
    fourth does not rewrite the object), each reason clipped to ``MAX_REASON``. Past ``MAX_LINKS``
    links (the API server would refuse the whole status) only the slowest are written."""
    return slowest_entries(
        links,
        limit=MAX_LINKS,
        fraction=lambda link: round(link.fraction, 3),
        gpus=lambda link: (link.gpu_a, link.gpu_b),
        reason=lambda link: link.reason or None,
    )


def links_from_wire(raw: object) -> tuple[tuple[DegradedLink, ...], list[str]]:
    """(links, problems): the entries that parse, and one line per entry that does not, naming the
    entry and its field (``degradedLinks[3].gpus: names GPU 2 twice; ...``)."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        return (), [f"{STATUS_FIELD} is not a list"]
    if len(raw) > MAX_LINKS:
        return (), [f"{STATUS_FIELD} has {len(raw)} entries, more than the {MAX_LINKS} the CRD allows"]
    links, problems = [], []
    for position, entry in enumerate(raw):
        try:
            links.append(DegradedLinkEntry.model_validate(entry).link())
        except ValidationError as exc:
            where, problem = first_problem(exc, whole="")
            field = f".{where}" if where else ""
            problems.append(f"{STATUS_FIELD}[{position}]{field}: {problem}")
    return tuple(links), problems
