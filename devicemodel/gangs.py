"""Which gang a pod belongs to, and how many members the gang has, from what users already set.

A gang is the pods of one training job that only make progress together: the extender places
them all or none (``gang_plan``). Three sources name one, checked in this order:

1. ``gpuweave.io/gang: NAME`` with ``gpuweave.io/gang-size: N`` (annotations; the size is required);
2. the scheduler-plugins coscheduling label ``scheduling.x-k8s.io/pod-group: NAME``; its size is
   the PodGroup's ``spec.minMember`` (``scheduling.x-k8s.io/v1alpha1``, watched when the CRD
   exists), else ``gpuweave.io/gang-size``; with neither the pod is treated as no gang (its size
   is unknown, and guessing one could hold devices for members that never come);
3. JobSet's pod labels ``jobset.sigs.k8s.io/jobset-name`` + ``jobset.sigs.k8s.io/replicatedjob-name``
   (one gang per replicated job and restart attempt); its size is ``gpuweave.io/gang-size``,
   else ``jobset.sigs.k8s.io/replicatedjob-replicas`` (the number of Jobs: right when each Job
   runs one pod, the usual layout of multi-node training; set ``gpuweave.io/gang-size`` on the
   pod template when Jobs run several);
4. Kueue's plain-pod groups: label ``kueue.x-k8s.io/pod-group-name: NAME``; its size is
   ``gpuweave.io/gang-size``, else Kueue's ``kueue.x-k8s.io/pod-group-total-count`` annotation
   (which Kueue requires on every pod of a group).

A gang of one (``alone``) is a pod that names its gang explicitly, ``gpuweave.io/gang: NAME`` with
``gpuweave.io/gang-size: 1`` (a one-pod training job): it is placed like any pod, but the gang rules
for preemption hold for it (it preempts nothing until an earlier attempt of its gang ran:
``gangs.service``). A size of 1 that comes only from the other sources (JobSet replicas 1, Kueue's
pod-group-total-count 1, a PodGroup's minMember 1, or ``gpuweave.io/gang-size: 1`` on a pod they
name) gives no gang: ``gang_of`` answers None and the pod is an ordinary pod.

A gang whose nodes Kueue's Topology Aware Scheduling assigned (its pods carry Kueue's
``kueue.x-k8s.io/workload`` annotation and one of its ``kueue.x-k8s.io/podset-*-topology``
annotations, from the admitted pod template) is not planned again here: Kueue admitted every
member's capacity in its topology assignment at once and its ungater pins each pod to its domain,
so ``gang_of`` treats the pods as ordinary pods (the extender still picks each pod's devices);
planning the gang among one pinned member's nodes could never hold the others.

A gang may require a network tier: ``gpuweave.io/gang-tier: LABEL`` (e.g. ``nvidia.com/gpu.clique``)
on its pods means every member goes inside one domain of that tier (or of a closer one), else the
gang waits; without it the gang takes the tightest domain that holds it, at any tier or none.

Gang keys are namespaced (``NS/source:name``), so equal names in two namespaces are two gangs.
A gang's *owner* is the object that made its pods, where there is one: Kueue's Workload (the
``kueue.x-k8s.io/workload`` annotation), else the JobSet (``jobset.sigs.k8s.io/jobset-uid``),
else the PodGroup (its UID, from the PodGroup watch), else the pod's controller (its
``ownerReferences`` entry with ``controller: true``: a Job, a PyTorchJob). With the key's family
(``gang_family``) and the size it makes a gang's ``family``, what stays the same across restarts
of one job: a gang counts as recovering only when an attempt of that same family ran
(``gangs.book``), so a job deleted and created again under the same name, or another job of
another size reusing the name, is a new gang.
Values are validated here, at the boundary: a size that is not a whole number in
1..``MAX_GANG_SIZE``, or a required tier that is not one of the extender's tier labels, raises
``BadGangError``, whose text the filter gives every node. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from devicemodel.errors import InvalidInputError, echo

ANNOTATION_GANG: Final = "gpuweave.io/gang"
ANNOTATION_GANG_SIZE: Final = "gpuweave.io/gang-size"
LABEL_POD_GROUP: Final = "scheduling.x-k8s.io/pod-group"
LABEL_JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOBSET_REPLICAS: Final = "jobset.sigs.k8s.io/replicatedjob-replicas"
LABEL_JOBSET_RESTART: Final = "jobset.sigs.k8s.io/restart-attempt"
LABEL_JOBSET_UID: Final = "jobset.sigs.k8s.io/jobset-uid"
LABEL_KUEUE_POD_GROUP: Final = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_KUEUE_GROUP_COUNT: Final = "kueue.x-k8s.io/pod-group-total-count"
ANNOTATION_KUEUE_WORKLOAD: Final = "kueue.x-k8s.io/workload"  # on the pods of an admitted Workload
KUEUE_TOPOLOGY_ANNOTATIONS: Final = (
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
    "kueue.x-k8s.io/podset-unconstrained-topology",
    "kueue.x-k8s.io/podset-slice-required-topology",
)
# What a fatal device fault under one member does to the rest of its gang (docs/health.md):
# "gang" (default) evicts every member, "pod" only the pods on the failed device.
ANNOTATION_GANG_EVICTION: Final = "gpuweave.io/gang-eviction"
# The network tier (a tier label of the extender's, e.g. nvidia.com/gpu.clique) one domain of
# which must hold every member (docs/extender.md, Gangs): where no domain of it (or of a closer
# tier) holds the whole gang, the gang waits.
ANNOTATION_GANG_TIER: Final = "gpuweave.io/gang-tier"
# How long the pod's job is expected to run ("4h", "90m", "1h30m", "5400": seconds): what a gang
# weighs a wait for its tightest network tier against (docs/extender.md, "Waiting for the tightest
# tier"), and how long a running pod is expected to hold its GPUs.
ANNOTATION_EXPECTED_DURATION: Final = "gpuweave.io/expected-duration"
MIN_EXPECTED_DURATION_S: Final = 1.0
MAX_EXPECTED_DURATION_S: Final = 30 * 86400.0  # 30 days: past it a run's length says nothing more
POD_GROUP_GROUP: Final = "scheduling.x-k8s.io"
POD_GROUP_VERSION: Final = "v1alpha1"
POD_GROUP_PLURAL: Final = "podgroups"
MAX_GANG_SIZE: Final = 4096
MAX_NAME_LENGTH: Final = 253  # a Kubernetes object name
_DIGITS = re.compile(r"[0-9]{1,5}")
_SECONDS = re.compile(r"[0-9]{1,8}")
_DURATION = re.compile(r"(?:[0-9]{1,6}[dhms]){1,4}")
_DURATION_PART = re.compile(r"([0-9]{1,6})([dhms])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_TIER_ECHO_CHARS = 100  # of a bad tier value quoted: leaves room in the reason for the labels it may take
_OWNER_CHARS = 253  # of an owner's name or UID kept in a family (an object name's limit)


class BadGangError(InvalidInputError):
    """The pod names a gang in a way the extender cannot act on (size missing or out of range, a
    required tier that is not a tier label)."""


@dataclass(frozen=True)
class Gang:
    """One gang: ``key`` identifies it cluster-wide, ``size`` is how many members it waits for,
    ``tier`` the tier label one domain of which must hold them all ("" for none required),
    ``owner`` the object that made its pods ("" for none: module doc)."""

    key: str
    size: int
    source: str  # annotation | pod-group | jobset | kueue-pod-group (for messages and docs)
    tier: str = ""
    owner: str = ""

    @property
    def family(self) -> str:
        """What stays the same across the job's restarts: the key's family, the size and the
        owner (module doc); the unit recovery is remembered by."""
        return f"{gang_family(self.key)}#{self.size}@{self.owner}"

    @property
    def alone(self) -> bool:
        """A gang of one (module doc): placed like any pod, preempting by the gang rules."""
        return self.size == 1


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _meta(pod: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
    metadata = _mapping(pod.get("metadata"))
    namespace = str(metadata.get("namespace") or "default")
    return namespace, _mapping(metadata.get("labels")), _mapping(metadata.get("annotations"))


def _name(value: object, *, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadGangError(f"{what} is {echo(value)}; give the gang's name (a non-empty string)")
    if len(value) > MAX_NAME_LENGTH:
        raise BadGangError(f"{what} is {len(value)} characters; the limit is {MAX_NAME_LENGTH}")
    return value.strip()


def parse_size(value: object, *, what: str = ANNOTATION_GANG_SIZE) -> int:
    """A gang size: ASCII digits (or a JSON integer), 1..``MAX_GANG_SIZE``."""
    if isinstance(value, bool):
        raise BadGangError(f"{what} is {echo(value)}; give a whole number of members 1..{MAX_GANG_SIZE}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        size = int(value.strip())
    else:
        shown = value if not isinstance(value, str) or len(value) <= 20 else value[:20] + "..."
        raise BadGangError(f"{what} is {echo(shown)}; give a whole number of members 1..{MAX_GANG_SIZE}")
    if not 1 <= size <= MAX_GANG_SIZE:
        raise BadGangError(f"{what} is {size}; a gang has 1..{MAX_GANG_SIZE} members")
    return size


def parse_expected_duration(value: object, *, what: str = ANNOTATION_EXPECTED_DURATION) -> float:
    """Seconds of a run-time estimate: whole seconds ("5400", or a JSON integer) or units d, h,
    m, s ("4h", "1h30m"), within ``MIN_EXPECTED_DURATION_S``..``MAX_EXPECTED_DURATION_S``; else
    ``BadGangError`` saying what it takes (the value quoted escaped and clipped)."""
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else None
    seconds: float | None = None
    if text is not None and _SECONDS.fullmatch(text):
        seconds = float(text)
    elif text is not None and _DURATION.fullmatch(text):
        seconds = float(sum(int(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text)))
    hint = (
        f"give a run time such as 4h, 90m, 1h30m or 5400 (seconds), 1s..{MAX_EXPECTED_DURATION_S / 86400:g}d"
    )
    if seconds is None:
        raise BadGangError(f"{what} is {echo(value, limit=40)}; {hint}")
    if not MIN_EXPECTED_DURATION_S <= seconds <= MAX_EXPECTED_DURATION_S:
        raise BadGangError(f"{what} is {seconds:.0f} s; {hint}")
    return seconds


def active_deadline_s(pod: Mapping[str, Any]) -> float | None:
    """The pod's ``spec.activeDeadlineSeconds`` (a Job's, which its pods carry, is its own bound),
    None when absent or not a positive whole number: the longest the pod can run."""
    value = _mapping(pod.get("spec")).get("activeDeadlineSeconds")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return float(min(value, MAX_EXPECTED_DURATION_S))


def gang_key(pod: Mapping[str, Any]) -> str:
    """The pod's gang key, "" for none; never raises (the cache tags every pod with it)."""
    try:
        found = _identity(pod)
    except BadGangError:
        return ""
    return found[0] if found is not None else ""


def _identity(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key, source) of the gang the pod names, None when it names none."""
    namespace, labels, annotations = _meta(pod)
    if ANNOTATION_GANG in annotations:
        return f"{namespace}/gang:{_name(annotations[ANNOTATION_GANG], what=ANNOTATION_GANG)}", "annotation"
    if LABEL_POD_GROUP in labels:
        return f"{namespace}/pod-group:{_name(labels[LABEL_POD_GROUP], what=LABEL_POD_GROUP)}", "pod-group"
    if LABEL_JOBSET_NAME in labels and LABEL_REPLICATED_JOB in labels:
        jobset = _name(labels[LABEL_JOBSET_NAME], what=LABEL_JOBSET_NAME)
        job = _name(labels[LABEL_REPLICATED_JOB], what=LABEL_REPLICATED_JOB)
        attempt = str(labels.get(LABEL_JOBSET_RESTART) or "0")
        return f"{namespace}/jobset:{jobset}/{job}/{attempt}", "jobset"
    if LABEL_KUEUE_POD_GROUP in labels:
        group = _name(labels[LABEL_KUEUE_POD_GROUP], what=LABEL_KUEUE_POD_GROUP)
        return f"{namespace}/kueue-pod-group:{group}", "kueue-pod-group"
    return None


def _owner(
    source: str,
    metadata: Mapping[str, Any],
    *,
    labels: Mapping[str, Any],
    annotations: Mapping[str, Any],
    pod_group_uid: object,
) -> str:
    """The object that made the gang's pods (module doc), "" for none."""
    workload = annotations.get(ANNOTATION_KUEUE_WORKLOAD)
    if isinstance(workload, str) and workload:
        return f"workload:{workload[:_OWNER_CHARS]}"
    jobset = labels.get(LABEL_JOBSET_UID)
    if source == "jobset" and isinstance(jobset, str) and jobset:
        return f"jobset:{jobset[:_OWNER_CHARS]}"
    if source == "pod-group" and isinstance(pod_group_uid, str) and pod_group_uid:
        return f"pod-group:{pod_group_uid[:_OWNER_CHARS]}"
    references = metadata.get("ownerReferences")
    for reference in references if isinstance(references, list) else []:
        entry = _mapping(reference)
        uid = entry.get("uid")
        if entry.get("controller") is True and isinstance(uid, str) and uid:
            return f"{str(entry.get('kind') or '')[:_OWNER_CHARS]}:{uid[:_OWNER_CHARS]}"
    return ""


def placed_by_kueue_topology(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue's Topology Aware Scheduling assigned the pod's domain (module doc)."""
    _, _, annotations = _meta(pod)
    if ANNOTATION_KUEUE_WORKLOAD not in annotations:
        return False
    return any(a in annotations for a in KUEUE_TOPOLOGY_ANNOTATIONS)


def evicts_whole_gang(pod: Mapping[str, Any]) -> bool:
    """Whether a fatal device fault under this gang member evicts the whole gang: yes unless the
    pod says ``gpuweave.io/gang-eviction: pod`` (an unknown value keeps the default)."""
    _, _, annotations = _meta(pod)
    return str(annotations.get(ANNOTATION_GANG_EVICTION, "gang")).strip() != "pod"


def gang_family(key: str) -> str:
    """What stays the same across a gang's restarts: a JobSet replicated job without its restart
    attempt; any other gang key as it is (a PyTorchJob or PodGroup re-creates pods under it)."""
    namespace, _, rest = key.partition("/")
    if rest.startswith("jobset:"):
        return f"{namespace}/{rest.rpartition('/')[0]}"
    return key


def parse_tier(value: object, *, tier_labels: Sequence[str]) -> str:
    """A required tier: one of ``tier_labels`` (the extender's network tiers), surrounding blanks
    ignored."""
    if isinstance(value, str) and value.strip() in tier_labels:
        return value.strip()
    known = ", ".join(tier_labels) if tier_labels else "none are configured"
    raise BadGangError(
        f"{ANNOTATION_GANG_TIER} is {echo(value, limit=_TIER_ECHO_CHARS)}; give one of the extender's "
        f"network tier labels ({known})"
    )


def gang_of(
    pod: Mapping[str, Any],
    *,
    min_members: Mapping[str, object],
    tier_labels: Sequence[str],
    pod_group_uids: Mapping[str, str] | None = None,
) -> Gang | None:
    """The pod's gang, None when it is in none (or its PodGroup's size is unknown, or its size of 1
    is not named by ``gpuweave.io/gang``: module doc).

    ``min_members``: ``NS/NAME`` -> ``spec.minMember`` of the PodGroups the extender watches, as
    the objects give it (validated here: a pod of a PodGroup with an unusable minMember is refused
    with the reason, not placed alone). ``tier_labels``: the extender's network tier labels, the
    values ``gpuweave.io/gang-tier`` may take. ``pod_group_uids``: ``NS/NAME`` -> the UID of the
    PodGroups watched (the owner of their gangs). Raises ``BadGangError`` for a size or tier it
    cannot accept (the tier is checked on every pod that names a gang)."""
    found = _identity(pod)
    if found is None or placed_by_kueue_topology(pod):
        return None
    key, source = found
    namespace, labels, annotations = _meta(pod)
    required = annotations.get(ANNOTATION_GANG_TIER)
    tier = parse_tier(required, tier_labels=tier_labels) if required is not None else ""
    explicit = annotations.get(ANNOTATION_GANG_SIZE)
    if source == "annotation":
        if explicit is None:
            raise BadGangError(
                f"pod names gang {echo(annotations[ANNOTATION_GANG])} but no {ANNOTATION_GANG_SIZE}; "
                "add the number of members"
            )
        size = parse_size(explicit)
    elif source == "pod-group":
        group = min_members.get(f"{namespace}/{labels[LABEL_POD_GROUP]}")
        if group == 0:
            return None  # minMember 0: the PodGroup asks for no gang
        if group is not None:
            size = parse_size(group, what=f"PodGroup {namespace}/{labels[LABEL_POD_GROUP]} minMember")
        elif explicit is not None:
            size = parse_size(explicit)
        else:
            return None  # a PodGroup we cannot see: size unknown, so placed one pod at a time
    elif source == "kueue-pod-group":
        size = parse_size(
            explicit if explicit is not None else annotations.get(ANNOTATION_KUEUE_GROUP_COUNT, "1"),
            what=ANNOTATION_GANG_SIZE if explicit is not None else ANNOTATION_KUEUE_GROUP_COUNT,
        )
    else:
        size = parse_size(
            explicit if explicit is not None else labels.get(LABEL_JOBSET_REPLICAS, "1"),
            what=ANNOTATION_GANG_SIZE if explicit is not None else LABEL_JOBSET_REPLICAS,
        )
    if size == 1 and source != "annotation":
        return None  # a size of 1 from a JobSet, Kueue group or PodGroup: an ordinary pod
    group_uid = (pod_group_uids or {}).get(f"{namespace}/{labels.get(LABEL_POD_GROUP)}")
    metadata = _mapping(pod.get("metadata"))
    owner = _owner(source, metadata, labels=labels, annotations=annotations, pod_group_uid=group_uid)
    return Gang(key=key, size=size, source=source, tier=tier, owner=owner)


def pod_group_entry(obj: Mapping[str, Any]) -> tuple[str, object] | None:
    """(NS/NAME, minMember as given) of a PodGroup object; None when it has no name or no
    minMember (its pods then need ``gpuweave.io/gang-size``). ``gang_of`` validates the value."""
    metadata = _mapping(obj.get("metadata"))
    name, namespace = metadata.get("name"), str(metadata.get("namespace") or "default")
    if not isinstance(name, str) or not name:
        return None
    size = _mapping(obj.get("spec")).get("minMember")
    return (f"{namespace}/{name}", size) if size is not None else None
