"""Plan one GPU's MIG reshape: which instances stay, which go, where new ones are placed.

The model is a buddy allocator over the GPU's memory slots: every profile may only start at its
listed slots (``hardware.mig_catalog``), instances never overlap, the compute slices add up to at most the
GPU's, and each profile has a maximum count. Busy instances are never destroyed; idle ones are kept
when they fit the target, destroyed otherwise. Among all placements of the new instances the
planner picks the one that leaves the most (and the largest) placements free, so small instances
fill from the high end and ``[0-3]`` stays free for 4g/3g. When the target cannot be reached the
error names the rule or busy instance that blocks it.

Pure: no I/O, no NVML. Exhaustive search is cheap: a GPU has at most 8 slots and 7 instances.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from devicemodel.errors import GpuweaveError
from hardware.mig_catalog import GiProfile, GpuModel, MigCatalogError, Placement


class MigPlanError(GpuweaveError):
    """The target layout cannot be reached on this GPU; the message names the blocker."""


@dataclass(frozen=True)
class Instance:
    """A GPU instance that exists now. ``key`` identifies it to the caller (GI id, MIG UUID...)."""

    profile: str
    start: int
    size: int
    busy: bool = False
    key: str = ""

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.size)

    def describe(self) -> str:
        state = "busy " if self.busy else ""
        return f"{state}instance {self.profile} at {self.placement.describe()}"


@dataclass(frozen=True)
class PlannedInstance:
    """An instance of the final layout: its profile and placement."""

    profile: str
    start: int
    size: int

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.size)


@dataclass(frozen=True)
class Plan:
    """An explicit reshape: destroy first, then create; ``final`` is the resulting layout."""

    model: str
    keep: tuple[Instance, ...]
    destroy: tuple[Instance, ...]
    create: tuple[PlannedInstance, ...]
    final: tuple[PlannedInstance, ...]

    @property
    def is_noop(self) -> bool:
        return not self.destroy and not self.create


@dataclass(frozen=True)
class TargetEntry:
    """One wanted instance; ``start`` pins its placement, None lets the planner choose."""

    profile: str
    start: int | None = None


def plan_layout(
    model: GpuModel,
    current: Sequence[Instance],
    target: Sequence[TargetEntry | str],
) -> Plan:
    """Reach exactly ``target`` (a profile list, optionally with pinned starts) from ``current``."""
    entries = tuple(TargetEntry(t) if isinstance(t, str) else t for t in target)
    profiles = _profiles(model, [e.profile for e in entries])
    _check_totals(model, profiles)
    _check_pinned_starts(model, entries)
    stray_busy = _busy_outside_target(current, entries)
    if stray_busy:
        blocked = _first_blocked(model, [i for i in current if i.busy], entries)
        if blocked is not None:
            raise MigPlanError(blocked)
        raise MigPlanError(
            f"{stray_busy.describe()} is not in the target layout and cannot be destroyed while in use; "
            "drain its pods or keep it in the target"
        )
    solution = _search(model, current, entries, allow_extra=False)
    if solution is None:
        raise MigPlanError(_blocker(model, current, entries))
    return solution


def plan_demand(
    model: GpuModel,
    current: Sequence[Instance],
    demand: Mapping[str, int],
) -> Plan:
    """Add instances for pending requests (profile -> count) where they fit, keeping what serves.

    Idle instances already of a requested profile count toward the demand; a count past what one
    GPU can hold of the profile (``max_count``) is that many. Requests are admitted
    largest profile first (first-fit decreasing); one that cannot fit alongside the busy instances
    and the admitted ones is left out. Idle instances nobody asked for are destroyed only to make
    room.
    """
    wanted: list[TargetEntry] = [TargetEntry(i.profile, i.start) for i in current if i.busy]
    requests: list[GiProfile] = []
    for profile, name in zip(_profiles(model, list(demand)), demand, strict=True):
        # no GPU holds more than max_count of a profile: the cost is bounded by the hardware,
        # whatever count a pending pod asks for
        requests.extend([profile] * min(max(0, demand[name]), profile.max_count))
    requests.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    best = _search(model, current, wanted, allow_extra=True)
    if best is None:
        raise MigPlanError(f"busy instances on {model.key} overlap; the current state is inconsistent")
    for profile in requests:
        candidate_entries = [*wanted, TargetEntry(profile.name)]
        trial = _try_totals(model, candidate_entries)
        solution = _search(model, current, candidate_entries, allow_extra=True) if trial else None
        if solution is not None:
            wanted, best = candidate_entries, solution
    return best


def _profiles(model: GpuModel, names: Sequence[str]) -> list[GiProfile]:
    try:
        return [model.profile(name) for name in names]
    except MigCatalogError as exc:
        raise MigPlanError(str(exc)) from exc


def _try_totals(model: GpuModel, entries: Sequence[TargetEntry]) -> bool:
    try:
        _check_totals(model, [model.profile(e.profile) for e in entries])
    except MigPlanError:
        return False
    return True


def _check_totals(model: GpuModel, profiles: Sequence[GiProfile]) -> None:
    counts = Counter(p.name for p in profiles)
    for profile in model.profiles:
        if counts[profile.name] > profile.max_count:
            raise MigPlanError(
                f"profile {profile.name} max count {profile.max_count} on {model.key}; "
                f"the target asks for {counts[profile.name]}"
            )
    memory = sum(p.memory_slices for p in profiles)
    if memory > model.memory_slices:
        raise MigPlanError(f"needs {memory} memory slices; the GPU ({model.key}) has {model.memory_slices}")
    compute = sum(p.compute_slices for p in profiles)
    if compute > model.compute_slices:
        raise MigPlanError(
            f"needs {compute} compute slices; the GPU ({model.key}) has {model.compute_slices}"
        )


def _check_pinned_starts(model: GpuModel, entries: Sequence[TargetEntry]) -> None:
    for entry in entries:
        profile = model.profile(entry.profile)
        if entry.start is not None and entry.start not in profile.starts:
            valid = ", ".join(str(s) for s in profile.starts)
            raise MigPlanError(
                f"placement start {entry.start} is not valid for {profile.name} on {model.key} "
                f"(valid: {valid})"
            )
    pinned = [e for e in entries if e.start is not None]
    for a, b in combinations(pinned, 2):
        pa = Placement(a.start or 0, model.profile(a.profile).memory_slices)
        pb = Placement(b.start or 0, model.profile(b.profile).memory_slices)
        if pa.mask & pb.mask:
            raise MigPlanError(
                f"pinned {a.profile} at {pa.describe()} overlaps {b.profile} at {pb.describe()}"
            )


def _busy_outside_target(current: Sequence[Instance], entries: Sequence[TargetEntry]) -> Instance | None:
    remaining = list(entries)
    for instance in sorted(current, key=lambda i: i.start):
        if not instance.busy:
            continue
        match = _matching_entry(instance, remaining)
        if match is None:
            return instance
        remaining.remove(match)
    return None


def _matching_entry(instance: Instance, entries: Sequence[TargetEntry]) -> TargetEntry | None:
    """A pinned entry at the instance's start wins over an unpinned one of the same profile."""
    same = [e for e in entries if e.profile == instance.profile and e.start in (None, instance.start)]
    same.sort(key=lambda e: e.start is None)
    return same[0] if same else None


@dataclass(frozen=True)
class _Choice:
    kept: tuple[Instance, ...]
    created: tuple[PlannedInstance, ...]
    score: tuple[int, int]


def _search(
    model: GpuModel,
    current: Sequence[Instance],
    entries: Sequence[TargetEntry],
    *,
    allow_extra: bool,
) -> Plan | None:
    """Keep as many current instances as possible, then place the rest for the best free space."""
    busy = [i for i in current if i.busy]
    idle = sorted((i for i in current if not i.busy), key=lambda i: (i.start, i.profile))
    for keep_count in range(len(idle), -1, -1):
        best: _Choice | None = None
        for kept_idle in combinations(idle, keep_count):
            choice = _place_rest(model, (*busy, *kept_idle), entries, allow_extra=allow_extra)
            if choice is not None and (best is None or choice.score > best.score):
                best = choice
        if best is not None:
            return _to_plan(model, current, best)
    return None


def _place_rest(
    model: GpuModel,
    kept: Sequence[Instance],
    entries: Sequence[TargetEntry],
    *,
    allow_extra: bool,
) -> _Choice | None:
    occupied = 0
    for instance in kept:
        if occupied & instance.placement.mask:
            return None
        occupied |= instance.placement.mask
    remaining = list(entries)
    for instance in kept:
        match = _matching_entry(instance, remaining)
        if match is not None:
            remaining.remove(match)
        elif not allow_extra:
            return None
    profiles_final = [model.profile(i.profile) for i in kept] + [model.profile(e.profile) for e in remaining]
    if not _fits_totals(model, profiles_final):
        return None
    best: _Choice | None = None
    for created in _placements_for(model, remaining, occupied):
        mask = occupied
        for planned in created:
            mask |= planned.placement.mask
        score = (_free_space_value(model, mask), sum(p.start for p in created))
        if best is None or score > best.score:
            best = _Choice(tuple(kept), created, score)
    return best


def _fits_totals(model: GpuModel, profiles: Sequence[GiProfile]) -> bool:
    counts = Counter(p.name for p in profiles)
    return (
        all(counts[p.name] <= p.max_count for p in model.profiles)
        and sum(p.memory_slices for p in profiles) <= model.memory_slices
        and sum(p.compute_slices for p in profiles) <= model.compute_slices
    )


def _placements_for(
    model: GpuModel, entries: Sequence[TargetEntry], occupied: int
) -> Iterator[tuple[PlannedInstance, ...]]:
    """Every way to place ``entries`` in the free slots; same-profile entries in rising order."""

    def size_first(entry: TargetEntry) -> tuple[bool, int, str]:
        return (entry.start is None, -model.profile(entry.profile).memory_slices, entry.profile)

    order = sorted(entries, key=size_first)
    yield from _place_from(model, order, occupied, (), 0)


def _place_from(
    model: GpuModel,
    order: Sequence[TargetEntry],
    occupied: int,
    placed: tuple[PlannedInstance, ...],
    depth: int,
) -> Iterator[tuple[PlannedInstance, ...]]:
    if depth == len(order):
        yield placed
        return
    entry = order[depth]
    profile = model.profile(entry.profile)
    floor = -1
    if depth > 0 and entry.start is None and order[depth - 1] == entry:
        floor = placed[-1].start  # identical unpinned entries: avoid permuted duplicates
    starts = (entry.start,) if entry.start is not None else profile.starts
    for start in starts:
        placement = Placement(start, profile.memory_slices)
        if start <= floor or occupied & placement.mask:
            continue
        planned = PlannedInstance(profile.name, start, profile.memory_slices)
        yield from _place_from(model, order, occupied | placement.mask, (*placed, planned), depth + 1)


def _free_space_value(model: GpuModel, occupied: int) -> int:
    """How much stays possible: free placements of every profile, larger ones weighing more."""
    value = 0
    for profile in model.profiles:
        for placement in profile.placements:
            if not occupied & placement.mask:
                value += profile.memory_slices * profile.memory_slices
    return value


def _to_plan(model: GpuModel, current: Sequence[Instance], choice: _Choice) -> Plan:
    kept_set = set(choice.kept)
    destroy = tuple(i for i in current if i not in kept_set)
    keep = tuple(sorted(choice.kept, key=lambda i: i.start))
    final = sorted(
        [PlannedInstance(i.profile, i.start, i.size) for i in keep] + list(choice.created),
        key=lambda p: p.start,
    )
    create = tuple(sorted(choice.created, key=lambda p: p.start))
    return Plan(model.key, keep, tuple(sorted(destroy, key=lambda i: i.start)), create, tuple(final))


def _blocker(model: GpuModel, current: Sequence[Instance], entries: Sequence[TargetEntry]) -> str:
    """Explain why no placement works: a busy instance in the way, or the slot rules themselves."""
    busy = [i for i in current if i.busy]
    if _search(model, [], entries, allow_extra=False) is None:
        wanted = " + ".join(e.profile if e.start is None else f"{e.profile}@{e.start}" for e in entries)
        return (
            f"no arrangement of {wanted} fits the placement rules of {model.key} "
            "(profiles may only start at their listed slots); choose a different set"
        )
    blocked = _first_blocked(model, busy, entries)
    if blocked is not None:
        return blocked
    names = " and ".join(b.describe() for b in busy) or "the current instances"
    return f"{names} leave no arrangement for the target on {model.key}; drain them or change the target"


def _first_blocked(model: GpuModel, busy: Sequence[Instance], entries: Sequence[TargetEntry]) -> str | None:
    """The largest target entry whose every placement overlaps a busy instance, said as a reason."""
    busy_mask = 0
    for instance in busy:
        busy_mask |= instance.placement.mask
    for entry in sorted(entries, key=lambda e: -model.profile(e.profile).memory_slices):
        profile = model.profile(entry.profile)
        starts = (entry.start,) if entry.start is not None else profile.starts
        options = [Placement(s, profile.memory_slices) for s in starts]
        if all(p.mask & busy_mask for p in options):
            blockers = [i for i in busy if any(i.placement.mask & p.mask for p in options)]
            names = " and ".join(b.describe() for b in blockers)
            verb = "blocks" if len(blockers) == 1 else "block"
            return f"{names} {verb} {profile.name}; drain it or choose a layout around it"
    return None
