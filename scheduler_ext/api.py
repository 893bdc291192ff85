"""The extender's front door: everything code outside ``scheduler_ext/`` may use.

``gpuweave status``, ``gpuweave simulate`` (the extender client and the FGD reproduction's
policy), the ``extender`` and ``status`` commands and the benchmarks import from here and from
nowhere deeper; import-linter's contract "Outside the extender, only its front door" holds that
(pyproject.toml). The rooms behind it (``pods``, ``decide``, ``cluster``, ``gangs``,
``preflight``, ``leader``, ``serving``, ``kueue``, ``app``, ``kube``) can then be rearranged without touching
their callers: a name moves, and only this module follows it.

Cluster mode's two names (``build_kube_extender``, ``list_calls``) import ``scheduler_ext.kube``,
and with it the Kubernetes client, only when called (the type checker sees ``kube``'s own
signatures), so ``gpuweave simulate`` and the benchmarks
that never talk to an API server do not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_ext.app import Extender, assemble, build_core, build_snapshot_extender
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import (
    DISRUPTION_CONDITION,
    PREEMPTED_REASON,
    InventoryRecord,
    PodRecord,
    inventory_record,
)
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects, read_objects
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.layout import GpuSlot
from scheduler_ext.decide.shares import ModelFor, fragment_models, node_fragment
from scheduler_ext.decide.shortlist import DEFAULT_KEEP
from scheduler_ext.decide.state import NodeState, share_capacity
from scheduler_ext.decide.summary import DeviceGroup, device_groups, generic_reason, reason_counts
from scheduler_ext.decide.verdict import Verdict
from scheduler_ext.decide.workload import load_workload_file, pod_shape, workload_document
from scheduler_ext.gangs.book import DEFAULT_TTL_S
from scheduler_ext.gangs.limits import DEFAULT_HOLD_SHARE, HOLD_LIMIT_FLAG, PERCENT_FLOOR_GPUS, HoldLimit
from scheduler_ext.gangs.service import GangSettings
from scheduler_ext.gangs.tier_cost import (
    DEFAULT_JOB_DURATION_S,
    DEFAULT_MAX_WAIT_S,
    DEFAULT_STRETCH_PER_STEP,
    TierCostSettings,
)
from scheduler_ext.leader import (
    DEFAULT_DURATION_S,
    DEFAULT_LEASE_NAME,
    DEFAULT_RETRY_S,
    LeaseSettings,
    lease_settings,
)
from scheduler_ext.pods.host import host_requests
from scheduler_ext.pods.requests import BadPodRequestError, PodRequest, pod_is_ours, pod_request
from scheduler_ext.preflight.book import FRESH_S, TIMEOUT_S, PreflightSettings
from scheduler_ext.serving.server import PriorityEncoder, decode_body, encode_filter_result
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderPreemptionArgs,
    parse,
)

__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_HOLD_SHARE",
    "DEFAULT_JOB_DURATION_S",
    "DEFAULT_KEEP",
    "DEFAULT_LEASE_NAME",
    "DEFAULT_MAX_WAIT_S",
    "DEFAULT_RETRY_S",
    "DEFAULT_STRETCH_PER_STEP",
    "DEFAULT_TTL_S",
    "DISRUPTION_CONDITION",
    "FRESH_S",
    "HOLD_LIMIT_FLAG",
    "PERCENT_FLOOR_GPUS",
    "PREEMPTED_REASON",
    "TIMEOUT_S",
    "BadPodRequestError",
    "ClusterCache",
    "DecisionCore",
    "DeviceGroup",
    "Extender",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderPreemptionArgs",
    "ExtenderService",
    "GangSettings",
    "GpuSlot",
    "HoldLimit",
    "InventoryRecord",
    "LeaseSettings",
    "ModelFor",
    "NodeState",
    "PodRecord",
    "PodRequest",
    "PreflightSettings",
    "PriorityEncoder",
    "SnapshotBinder",
    "TierCostSettings",
    "Verdict",
    "apply_objects",
    "assemble",
    "build_core",
    "build_kube_extender",
    "build_snapshot_extender",
    "decode_body",
    "device_groups",
    "encode_filter_result",
    "fragment_models",
    "generic_reason",
    "host_requests",
    "inventory_record",
    "lease_settings",
    "list_calls",
    "load_workload_file",
    "node_fragment",
    "parse",
    "pod_is_ours",
    "pod_request",
    "pod_shape",
    "read_objects",
    "reason_counts",
    "share_capacity",
    "workload_document",
]


if TYPE_CHECKING:
    from scheduler_ext.kube import build_kube_extender, list_calls
else:

    def build_kube_extender(*args, **kwargs):
        """The extender in cluster mode (watches, Bindings, Events): ``scheduler_ext.kube``'s."""
        from scheduler_ext import kube  # noqa: PLC0415 (kubernetes: in cluster mode only)

        return kube.build_kube_extender(*args, **kwargs)

    def list_calls(*args, **kwargs):
        """(plural, kind, list call) of each kind the extender mirrors: ``scheduler_ext.kube``'s."""
        from scheduler_ext import kube  # noqa: PLC0415 (kubernetes: in cluster mode only)

        return kube.list_calls(*args, **kwargs)
