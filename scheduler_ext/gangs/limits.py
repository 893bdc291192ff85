"""What a gang must show before devices are held for it, and how much one namespace may hold.

A gang's plan holds devices for every member not yet placed (``gangs.book``), so what a pod says
about its gang decides how much of the cluster is held for pods that may never come. Two rules
bound it:

1. **Members first.** A gang is planned, and anything held for it, only once the cache knows as
   many of its pods as it declares (pending or bound: ``ClusterCache.gang_member_uids``), as the
   scheduler-plugins coscheduling plugin waits for ``minMember``. Until then each member is
   refused with the count (``missing_members_reason``).
2. **A namespace's share.** The open places of one namespace's gangs together hold at most
   ``HoldLimit`` GPUs (``gpuweave extender --gang-hold-per-namespace``: a number of GPUs, or a
   percentage of the GPUs of the nodes with an inventory, never below ``PERCENT_FLOOR_GPUS`` so
   that a small cluster runs a gang of most of its nodes; default 50%). A plan that would go past
   it holds nothing, and its member is refused with the numbers (``over_limit_reason``), counted
   (``gpuweave_extender_gangs_total{outcome="over-limit"}``) and told in a
   ``GpuweaveGangHoldLimit`` Event. A GPU counts once per slot whether the slot holds it whole or
   in part (a MIG device, a share).

Pure: numbers in, numbers and reasons out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from devicemodel.assignment import parent_gpu_of_share
from devicemodel.errors import InvalidInputError, echo
from scheduler_ext.decide.state import NodeState

HOLD_LIMIT_FLAG = "--gang-hold-per-namespace"
DEFAULT_HOLD_SHARE = 0.5
# A percentage limit is never below this many GPUs: on a cluster of up to twice as many, the
# default lets one namespace's gang take any number of its GPUs (e.g. two 8-GPU nodes of three)
PERCENT_FLOOR_GPUS = 64
_PERCENT = re.compile(r"([0-9]{1,3})%")
_COUNT = re.compile(r"[0-9]{1,7}")


@dataclass(frozen=True)
class HoldLimit:
    """GPUs the open places of one namespace's gangs may hold: ``gpus`` outright when above 0,
    else ``share`` of the GPUs of the nodes the extender has an inventory of, at least
    ``PERCENT_FLOOR_GPUS``."""

    gpus: int = 0
    share: float = DEFAULT_HOLD_SHARE

    @classmethod
    def parse(cls, text: str) -> HoldLimit:
        """``64`` (GPUs) or ``50%`` (of the cluster's GPUs); raises ``InvalidInputError``."""
        value = text.strip()
        if (percent := _PERCENT.fullmatch(value)) is not None and 1 <= int(percent.group(1)) <= 100:
            return cls(share=int(percent.group(1)) / 100)
        if _COUNT.fullmatch(value) and int(value) >= 1:
            return cls(gpus=int(value))
        raise InvalidInputError(
            f"{HOLD_LIMIT_FLAG} is {echo(text)}; give a number of GPUs (e.g. 64) or a percentage "
            "1%..100% of the cluster's GPUs (e.g. 50%)"
        )

    def of(self, cluster_gpus: int) -> int:
        """The limit in GPUs on a cluster of ``cluster_gpus``."""
        if self.gpus > 0:
            return self.gpus
        return max(math.ceil(self.share * cluster_gpus), PERCENT_FLOOR_GPUS)

    def describe(self, cluster_gpus: int) -> str:
        if self.gpus > 0:
            return f"{self.gpus} GPUs"
        return (
            f"{self.of(cluster_gpus)} GPUs: {self.share:.0%} of the cluster's {cluster_gpus}, "
            f"at least {PERCENT_FLOOR_GPUS}"
        )


def gpus_of(devices: Iterable[str], state: NodeState | None) -> int:
    """The GPUs ``devices`` are on (a whole GPU, a MIG device's parent, a share's GPU), each once;
    EFA adapters and devices the node does not list count nothing."""
    index, layout = (state.index, state.layout) if state is not None else (None, None)
    whole = frozenset(index.gpu_uuids.values()) if index is not None else frozenset()
    mig_parent = (
        {index.mig_uuids[m.position]: index.gpu_uuids.get(m.parent_index, "") for m in layout.migs}
        if index is not None and layout is not None
        else {}
    )
    gpus = set()
    for device in devices:
        parent = parent_gpu_of_share(device) or mig_parent.get(device) or (device if device in whole else "")
        if parent:
            gpus.add(parent)
    return len(gpus)


def missing_members_reason(key: str, *, seen: int, size: int) -> str:
    """A member's reason while its gang has fewer pods than it declares."""
    return (
        f"gang {key}: {seen} of its {size} members exist; a gang is planned, and devices held for "
        "it, only once all its members are created; no device is held for it"
    )


def over_limit_reason(key: str, *, want: int, held: int, limit: str) -> str:
    """A member's reason when holding its gang's places would take its namespace past the limit."""
    namespace = key.partition("/")[0]
    return (
        f"gang {key} would hold {want} GPU(s) for its members not placed yet and namespace "
        f"{namespace}'s gangs hold {held} now; one namespace's gangs may hold at most {limit} "
        f"({HOLD_LIMIT_FLAG}); no device is held for it"
    )
