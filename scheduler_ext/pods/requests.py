"""What a pod asks of gpuweave: per-container device requests, capability selector, placement policy.

Parsed once per pod from the pod object kube-scheduler sends (a plain dict), so the decision core
works on small frozen values and can memoize on them. Extended resources are whole numbers in
Kubernetes; the limit is authoritative (kubelet requires request == limit for them) and a request
alone is accepted as both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from devicekinds.registry import KINDS
from devicemodel.contracts import (
    ANNOTATION_GPU_SELECTOR,
    ANNOTATION_PLACEMENT,
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    RESOURCE_IMEX_CHANNEL,
    RESOURCE_MIG_PREFIX,
    mig_profile_of_resource,
    mig_resource_name,
    requests_resource,
)
from devicemodel.errors import InvalidInputError, echo
from devicemodel.quantity import MAX_STORED, QuantityError, whole_units

GPUWEAVE_PREFIX = "gpuweave.io/"
OUR_PREFIXES = (RESOURCE_GPU, RESOURCE_MIG_PREFIX, RESOURCE_EFA, GPUWEAVE_PREFIX)


class Placement(StrEnum):
    """Topology policy from the ``gpuweave.io/placement`` annotation."""

    BEST_EFFORT = "best-effort"
    NVLINK_REQUIRED = "nvlink-required"
    NIC_ALIGNED = "nic-aligned"
    SINGLE_NUMA = "single-numa"


class BadPodRequestError(InvalidInputError):
    """The pod's resource requests or gpuweave annotations cannot be understood."""


@dataclass(frozen=True)
class ContainerRequest:
    """Device counts one container asks for. ``mig`` is sorted (profile, count) pairs; ``extra``
    sorted (resource, count) pairs of the kinds the decision core plans generically (a resource
    kind of the registry with no planner of its own, ``ResourceKind.core_planned`` False)."""

    name: str
    init: bool = False
    gpus: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    efa: int = 0
    compute: int = 0  # 1% of one GPU's SMs per unit
    memory_gib: int = 0  # 1 GiB of one GPU's memory per unit
    shared: int = 0  # time-sliced replicas of one GPU
    extra: tuple[tuple[str, int], ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (
            self.gpus or self.mig or self.efa or self.compute or self.memory_gib or self.shared or self.extra
        )

    @property
    def wants_share(self) -> bool:
        return bool(self.compute or self.memory_gib or self.shared)


@dataclass(frozen=True)
class PodRequest:
    """Everything the decision core needs to know about one pod; hashable for memoization."""

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]
    selector: str | None = None
    placement: Placement = Placement.BEST_EFFORT
    priority: int = 0
    imex: bool = False  # asks for an IMEX channel: the bind records the job's IMEX domain

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def interested(self) -> bool:
        """False for pods gpuweave must pass through untouched."""
        return self.selector is not None or any(not c.is_empty for c in self.containers)

    @cached_property
    def signature(self) -> tuple[object, ...]:
        """The part of the request decisions depend on (names and UID excluded)."""
        return (self.containers_signature, self.selector, self.placement)

    @property
    def containers_signature(self) -> tuple[tuple[object, ...], ...]:
        return tuple(
            (c.init, c.gpus, c.mig, c.efa, c.compute, c.memory_gib, c.shared, c.extra)
            for c in self.containers
        )

    def pod_gpus(self) -> int:
        """Whole GPUs the pod holds at once: init containers run one at a time, before the rest."""
        app = sum(c.gpus for c in self.containers if not c.init)
        init = max((c.gpus for c in self.containers if c.init), default=0)
        return max(app, init)


def parse_count(value: object, *, resource: str, container: str) -> int:
    """A whole-number quantity ("2", 2, "2000m", "2e0") as the API server accepts it for an
    extended resource: a Kubernetes quantity (``quantity``), integral and not negative."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadPodRequestError(
            f"container {echo(container)}: {resource} must be a whole number, got {echo(value)}"
        )
    if isinstance(value, int):
        if 0 <= value <= MAX_STORED:
            return value
        raise BadPodRequestError(
            f"container {echo(container)}: {resource} must be a whole number from 0 to 2^63-1"
        )
    text = repr(value) if isinstance(value, float) else str(value)
    try:
        return whole_units(text)
    except QuantityError as exc:
        raise BadPodRequestError(
            f"container {echo(container)}: {resource}={echo(value)} must be a whole number: {exc}"
        ) from None


def _our_resources(values: object, *, section: str, container: str) -> dict[str, int]:
    """The gpuweave-managed entries of one ``resources.requests``/``limits`` map, as counts."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise BadPodRequestError(f"container {echo(container)}: resources.{section} must be an object")
    counts: dict[str, int] = {}
    for key, value in values.items():
        name = str(key)
        kind = KINDS.kind_for(name)
        if (kind is None and not name.startswith(OUR_PREFIXES)) or (kind is not None and not kind.scheduled):
            continue  # not ours, or left to kube-scheduler (the IMEX channel: given by the kubelet)
        if kind is None and name.startswith(GPUWEAVE_PREFIX):
            known = ", ".join(sorted(KINDS.names_under(GPUWEAVE_PREFIX)))
            raise BadPodRequestError(
                f"container {echo(container)}: unknown resource {echo(name)}; gpuweave serves {known}"
            )
        counts[name] = parse_count(value, resource=name, container=container)
    return counts


def _container_counts(resources: Mapping[str, Any], *, container: str) -> dict[str, int]:
    """Limits are authoritative, as the API server makes them for extended resources: a request
    must equal its limit (a request alone stands for both, as a limit alone does)."""
    requests = _our_resources(resources.get("requests"), section="requests", container=container)
    limits = _our_resources(resources.get("limits"), section="limits", container=container)
    for name, count in requests.items():
        if name in limits and limits[name] != count:
            raise BadPodRequestError(
                f"container {echo(container)}: {name} request {count} differs from its limit {limits[name]}; "
                "extended resources cannot be overcommitted, set both to the same count"
            )
    return {**requests, **limits}


def _container_request(container: Mapping[str, Any], *, init: bool) -> ContainerRequest:
    name = str(container.get("name", ""))
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise BadPodRequestError(f"container {echo(name)}: resources must be an object")
    counts = _container_counts(resources, container=name)
    mig = tuple(
        sorted(
            (profile, n)
            for k, n in counts.items()
            if n and (profile := mig_profile_of_resource(k)) is not None
        )
    )
    extra = tuple(
        sorted(
            (k, n)
            for k, n in counts.items()
            if n and (kind := KINDS.kind_for(k)) is not None and not kind.core_planned
        )
    )
    return ContainerRequest(
        name=name,
        init=init,
        gpus=counts.get(RESOURCE_GPU, 0),
        mig=mig,
        efa=counts.get(RESOURCE_EFA, 0),
        compute=counts.get(RESOURCE_GPU_COMPUTE, 0),
        memory_gib=counts.get(RESOURCE_GPU_MEMORY, 0),
        shared=counts.get(RESOURCE_GPU_SHARED, 0),
        extra=extra,
    )


def _validate_container(request: ContainerRequest) -> None:
    """Each resource kind's rules across one container's counts (whole GPUs and shares at once...)."""
    counts = request_counts(request)
    for kind in KINDS:
        problem = kind.check_request(counts, container=echo(request.name))
        if problem is not None:
            raise BadPodRequestError(problem)


def request_counts(request: ContainerRequest) -> dict[str, int]:
    """Resource name -> the count one container asks (the counts ``pod_request`` parsed)."""
    counts = (
        (RESOURCE_GPU, request.gpus),
        (RESOURCE_EFA, request.efa),
        (RESOURCE_GPU_COMPUTE, request.compute),
        (RESOURCE_GPU_MEMORY, request.memory_gib),
        (RESOURCE_GPU_SHARED, request.shared),
        *((mig_resource_name(profile), n) for profile, n in request.mig),
        *request.extra,
    )
    return {resource: n for resource, n in counts if n}


def _check_unique_names(containers: list[ContainerRequest]) -> None:
    """The API server refuses a pod whose containers (init ones included) share a name; devices
    are recorded per container name, so two of them would share one container's assignment."""
    seen: set[str] = set()
    for request in containers:
        if request.name in seen:
            raise BadPodRequestError(
                f"pod has two containers named {echo(request.name)}; container names must be unique "
                "(init containers included)"
            )
        seen.add(request.name)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def parse_placement(value: object) -> Placement:
    if value is None:
        return Placement.BEST_EFFORT
    text = str(value).strip().lower()
    try:
        return Placement(text)
    except ValueError:
        valid = ", ".join(p.value for p in Placement)
        raise BadPodRequestError(
            f"annotation {ANNOTATION_PLACEMENT}={echo(value)} is not one of: {valid}"
        ) from None


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """Parse a v1.Pod (as a dict) into a ``PodRequest``; raises ``BadPodRequestError`` on nonsense."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        raise BadPodRequestError("pod metadata and spec must be objects")
    containers: list[ContainerRequest] = []
    for section, init in (("initContainers", True), ("containers", False)):
        items = spec.get(section) or []
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            raise BadPodRequestError(f"pod spec.{section} must be a list of objects")
        containers.extend(_container_request(c, init=init) for c in items)
    for request in containers:
        _validate_container(request)
    _check_unique_names(containers)
    annotations = _annotations(pod)
    selector = annotations.get(ANNOTATION_GPU_SELECTOR)
    priority = spec.get("priority")
    return PodRequest(
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        containers=tuple(containers),
        selector=str(selector).strip() if selector is not None and str(selector).strip() else None,
        placement=parse_placement(annotations.get(ANNOTATION_PLACEMENT)),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        imex=requests_resource(pod, RESOURCE_IMEX_CHANNEL),
    )


def pod_is_ours(pod: Mapping[str, Any]) -> bool:
    """Cheap pass-through test: does the pod mention any of our resources or annotations?"""
    annotations = _annotations(pod)
    if ANNOTATION_GPU_SELECTOR in annotations or ANNOTATION_PLACEMENT in annotations:
        return True
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        return False
    for section in ("initContainers", "containers"):
        for container in spec.get(section) or []:
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for values in (resources.get("requests"), resources.get("limits")):
                if isinstance(values, Mapping) and any(_ours(str(k)) for k in values):
                    return True
    return False


def _ours(resource: str) -> bool:
    return resource.startswith(OUR_PREFIXES) or KINDS.kind_for(resource) is not None
