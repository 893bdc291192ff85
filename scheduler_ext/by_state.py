"""Filter's per-node work done once per node state: group the names by memo token, decide and
rank each distinct state once, spread the answers back to the names with numpy.

A token names a node's state (its layout, hence its kind, and its free devices), and equal tokens
decide alike, so 15,000 nodes come down to a few dozen states. What stays per name is what the
answer itself holds: the token lookup, the passing names and the rejected names with their
reasons, each one C-level or numpy pass. A name with no token (a node that came into the cache
while the call ran) is a state of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter

import numpy as np

from scheduler_ext.verdict import Verdict

_FITS, _UNRESOLVABLE, _REASON, _HELD = (attrgetter(a) for a in ("fits", "unresolvable", "reason", "held"))


@dataclass(frozen=True)
class StateGroups:
    """The names of one request grouped by state: ``first[i]`` is the position of the first name
    in state ``i``, ``inverse[j]`` the state of name ``j``, ``tokens[i]`` state ``i``'s token
    (None: a name the cache did not know when its tokens were looked up)."""

    first: list[int]
    inverse: np.ndarray
    tokens: list[int | None]

    @staticmethod
    def of(tokens: np.ndarray) -> StateGroups:
        """From the names' tokens (``TokenTable.keys``: -1 where a name has none)."""
        missing = np.flatnonzero(tokens < 0)
        keys = tokens
        if missing.size:  # tokens are never negative: each missing one gets a key of its own below 0
            keys = tokens.copy()
            keys[missing] = -1 - missing
        unique, inverse = np.unique(keys, return_inverse=True)  # no return_index: a stable sort
        inverse = inverse.reshape(-1)
        first = np.empty(len(unique), dtype=np.int64)
        first[inverse[::-1]] = np.arange(len(keys) - 1, -1, -1)  # the last write is the first name
        return StateGroups(
            first=first.tolist(),
            inverse=inverse,
            tokens=[None if k < 0 else k for k in unique.tolist()],
        )

    def present(self, mask: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The states that some name in ``mask`` has, in state order, and each masked name's
        position among them (a count per state, no sort)."""
        states = self.inverse[mask]
        seen = np.bincount(states, minlength=len(self.first)) > 0
        position = np.cumsum(seen) - 1
        return np.flatnonzero(seen).tolist(), position[states]

    def representatives(self, names: Sequence[str]) -> list[str]:
        """One name per state, in state order (the name each state is decided on)."""
        return [names[i] for i in self.first]


@dataclass(frozen=True)
class Filtered:
    """Filter's per-name answer, spread from one verdict per state."""

    fits: np.ndarray  # bool per name
    failed: dict[str, str]  # rejected, preemption may help
    hopeless: dict[str, str]  # rejected, nothing on the node can help
    rejected: dict[str, int]  # names rejected per distinct reason (counted per state: no pass per name)

    @staticmethod
    def spread(names: Sequence[str], groups: StateGroups, verdicts: Sequence[Verdict]) -> Filtered:
        fits = np.fromiter(map(_FITS, verdicts), dtype=bool, count=len(verdicts))[groups.inverse]
        if fits.all():
            return Filtered(fits, {}, {}, {})
        unresolvable = np.fromiter(map(_UNRESOLVABLE, verdicts), dtype=bool, count=len(verdicts))
        reasons = np.array(list(map(_REASON, verdicts)), dtype=object)
        states = groups.inverse
        hopeless_mask = ~fits & unresolvable[states]
        failed_mask = ~fits & ~hopeless_mask
        per_name = reasons[states]
        rejected: dict[str, int] = {}
        per_state = np.bincount(states[~fits], minlength=len(verdicts)).tolist()
        for reason, count in zip(reasons.tolist(), per_state, strict=True):
            if count:
                rejected[reason] = rejected.get(reason, 0) + count
        failed, hopeless = _named(names, failed_mask, per_name), _named(names, hopeless_mask, per_name)
        return Filtered(fits, failed, hopeless, rejected)


def _named(names: Sequence[str], mask: np.ndarray, reasons: np.ndarray) -> dict[str, str]:
    """name -> reason for the masked names (compress over the list: no object array of names)."""
    return dict(zip(compress(names, mask.tolist()), reasons[mask].tolist(), strict=True))


def held_per_state(verdicts: Sequence[Verdict]) -> np.ndarray:
    """Devices held on each state's nodes when decided (the shortlist's fullness)."""
    return np.fromiter(map(_HELD, verdicts), dtype=np.int64, count=len(verdicts))


class TokenTable:
    """Name -> memo token, kept twice: a dict for single lookups and a numpy array by node slot
    for filter's whole name list.

    kube-scheduler sends filter the same list of names pod after pod (every feasible node, in its
    node order), freshly decoded each time: a dict lookup per new string costs about 4 ms at
    15,000 names. The table remembers the last list's slots; when the next list is equal (one
    C-level comparison) and no node got a slot since, the tokens are one numpy gather. A slot is
    never given to another name, so a node that left reads -1 (unknown) until the list changes."""

    def __init__(self) -> None:
        self._by_name: dict[str, int] = {}
        self._slots: dict[str, int] = {}
        self._array = np.full(1024, -1, dtype=np.int64)
        self._used = 0  # slots handed out
        self._generation = 0  # bumped when a name gets a slot
        self._last: tuple[list[str], int, np.ndarray] | None = None  # names, generation, slots
        self._lock = threading.Lock()

    def mapping(self) -> Mapping[str, int]:
        """The live name -> token map (do not mutate)."""
        return self._by_name

    def set(self, name: str, token: int) -> None:
        with self._lock:
            slot = self._slots.get(name)
            if slot is None:
                slot = self._new_slot(name)
            self._array[slot] = token
            self._by_name[name] = token

    def drop(self, name: str) -> None:
        with self._lock:
            slot = self._slots.pop(name, None)
            if slot is not None:
                self._array[slot] = -1
            self._by_name.pop(name, None)

    def keys(self, names: list[str]) -> np.ndarray:
        """The names' tokens as int64, -1 for a name with none (``StateGroups.of`` takes them)."""
        with self._lock:  # slots and the array change together under it (compaction moves both)
            last = self._last
            if last is not None and last[1] == self._generation and last[0] == names:
                return np.take(self._array, last[2])
            found = list(map(self._slots.get, names))
            if None in found:  # a name the table does not know: no slot list to remember
                by_name = map(self._by_name.get, names)
                return np.array([-1 if t is None else t for t in by_name], dtype=np.int64)
            slots = np.array(found, dtype=np.int64)
            self._last = (names, self._generation, slots)
            return np.take(self._array, slots)

    def _new_slot(self, name: str) -> int:
        if self._used == len(self._array):
            live = len(self._slots)
            if live * 2 < self._used:  # mostly departed names: hand out slots anew
                self._compact()
            else:
                grown = np.full(2 * len(self._array), -1, dtype=np.int64)
                grown[: self._used] = self._array
                self._array = grown
        slot = self._used
        self._used += 1
        self._slots[name] = slot
        self._generation += 1
        return slot

    def _compact(self) -> None:
        names = list(self._slots)
        array = np.full(len(self._array), -1, dtype=np.int64)
        for slot, name in enumerate(names):
            array[slot] = self._by_name.get(name, -1)
        self._slots = {name: slot for slot, name in enumerate(names)}
        self._used = len(names)
        self._array = array
        self._last = None
        self._generation += 1
