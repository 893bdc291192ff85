"""The Kueue admission check controller of the extender (``checks`` decides, this reads and writes).

When the API serves Kueue's ``kueue.x-k8s.io/v1beta2`` AdmissionChecks and lets the extender list
them, the extender watches AdmissionChecks and Workloads and serves every
AdmissionCheck whose ``spec.controllerName`` is ``gpuweave.io/gpu-health``: it marks them
``Active`` and keeps each Workload's state of them (``status.admissionChecks``, written with
server-side apply under the field manager ``gpuweave-kueue-check``, only that one entry).

Without Kueue's CRDs (or the right to list AdmissionChecks) nothing is watched; the API is asked
again in the background, so Kueue installed later is served without a restart.

One thread looks at the Workloads whenever one changes and at least every ``interval_s`` (device
health and free GPUs come from the extender's cache, which changes without a Workload event).
Per pass it reads only what it needs: a pending Workload's flavors (one GET per flavor, one node
list per flavor's labels) and, for a pod that holds a failed device, which Workload it belongs to
(one GET of the pod, remembered: Kueue's ``kueue.x-k8s.io/workload`` annotation, else its JobSet,
Job or Kueue pod group label, or the pod itself). A pod that opts out
of health eviction (``gpuweave.io/no-health-eviction=true``) or asks to be moved alone
(``gpuweave.io/gang-eviction: pod``) requeues nothing, as the node agent does not move its gang.
Pods are matched to Workloads of their own namespace only: a pod's labels and annotations are
written by whoever creates it, and a namespace is the boundary of that trust.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from devicemodel.contracts import ANNOTATION_OPT_OUT_EVICTION
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import (
    ANNOTATION_KUEUE_WORKLOAD,
    LABEL_JOBSET_NAME,
    LABEL_KUEUE_POD_GROUP,
    evicts_whole_gang,
)
from devicemodel.preflight import MAX_GPUS
from kubeio.client import finish
from kubeio.errors import CONFLICT, describe, status_of
from kubeio.listwatch import ListWatch
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.decide.state import NodeState
from scheduler_ext.kueue.checks import (
    CONTROLLER_NAME,
    KUEUE_GROUP,
    KUEUE_VERSION,
    HeldFault,
    Verdict,
    Workload,
    free_gpus_by_node,
    held_faults,
    parse_workload,
    placement_nodes,
    pod_set_needs,
    verdict_for_admission,
    verdict_for_faults,
)
from scheduler_ext.preflight.book import PreflightBook

LOG = logging.getLogger(__name__)
FIELD_MANAGER = "gpuweave-kueue-check"
APPLY_PATCH = "application/apply-patch+yaml"
INTERVAL_S = 1.0
PROBE_MAX_S = 60.0
MAX_REMEMBERED_PODS = 4096
LABEL_JOB = "batch.kubernetes.io/job-name"
LABEL_JOB_LEGACY = "job-name"

Owner = tuple[str, str, str]  # (namespace, kind, name); kind "group" for a Kueue pod group


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


class KueueChecks:
    """Serves gpuweave's Kueue AdmissionChecks until ``stop``."""

    def __init__(self, cache: ClusterCache, api: client.ApiClient, *, interval_s: float = INTERVAL_S) -> None:
        self._cache = cache
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._interval_s = interval_s
        self._api = api
        self._prober: threading.Thread | None = None
        self._lock = threading.Lock()
        self._checks: dict[str, bool] = {}  # our AdmissionChecks' names -> marked Active
        self._workloads: dict[str, Workload] = {}  # namespace/name -> the Workload, parsed
        self._owners: OrderedDict[str, Owner | None] = OrderedDict()  # pod UID -> its workload's owner
        self.preflight: PreflightBook | None = None  # member nodes prove their GPUs before Ready
        self._wake = threading.Event()
        self._halt = threading.Event()
        self.watchers = [
            ListWatch(self._list("admissionchecks"), on_event=self._on_check, what="kueue-admissionchecks"),
            ListWatch(self._list("workloads"), on_event=self._on_workload, what="kueue-workloads"),
        ]
        self._thread = threading.Thread(target=self._run, name="gpuweave-kueue-checks", daemon=True)

    @staticmethod
    def served(api: client.ApiClient) -> bool:
        """Whether the API serves Kueue's AdmissionChecks to this extender (one list call; 404
        without Kueue's CRDs, 403 without the RBAC rules of docs/extender.md, Kueue)."""
        custom = client.CustomObjectsApi(api)
        try:
            finish(
                custom.list_cluster_custom_object(
                    KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", limit=1, _preload_content=False
                )
            )
        except (ApiException, HTTPError) as exc:
            LOG.info("not serving Kueue admission checks (%s)", describe(exc))
            return False
        return True

    def _list(self, plural: str) -> Callable[..., Any]:
        def list_call(**kwargs: Any) -> Any:
            return self._custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, **kwargs)

        return list_call

    def start(self) -> None:
        """Serve the checks once the API serves AdmissionChecks: at once when it does, else
        asked again after 1, 2, 4 ... 60 s (Kueue installed after gpuweave, its CRDs not yet
        established), in the background."""
        prober = threading.Thread(target=self._start_when_served, name="gpuweave-kueue-probe", daemon=True)
        self._prober = prober
        prober.start()

    def _start_when_served(self) -> None:
        delay = 1.0
        while not self.served(self._api):
            if self._halt.wait(timeout=delay):
                return
            delay = min(delay * 2, PROBE_MAX_S)
        if self._halt.is_set():
            return
        for watcher in self.watchers:
            watcher.start()
        self._thread.start()
        LOG.info("serving Kueue admission checks of controllerName %s", CONTROLLER_NAME)

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self._prober is not None:
            self._prober.join(timeout=2)
        for watcher in self.watchers:
            watcher.stop(join_s=1)
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    # ---- watches ----------------------------------------------------------------------------
    def _on_check(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = _name(obj)
        ours = str((obj.get("spec") or {}).get("controllerName") or "") == CONTROLLER_NAME
        with self._lock:
            if kind == "DELETED" or not ours:
                self._checks.pop(name, None)
            else:
                conditions = (obj.get("status") or {}).get("conditions") or []
                active = any(
                    isinstance(c, Mapping) and c.get("type") == "Active" and c.get("status") == "True"
                    for c in conditions
                )
                self._checks[name] = active
        self._wake.set()

    def _on_workload(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Parsed once per event (a pass then reads the parsed Workloads); one that does not parse
        is skipped with its reason until it changes."""
        metadata = obj.get("metadata") or {}
        key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
        workload: Workload | None = None
        if kind != "DELETED":
            try:
                workload = parse_workload(obj)
            except InvalidInputError as exc:
                LOG.warning("skipping Workload %s: %s", key, exc)
        with self._lock:
            if workload is None:
                self._workloads.pop(key, None)
            else:
                self._workloads[key] = workload
        self._wake.set()

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(timeout=self._interval_s)
            self._wake.clear()
            if self._halt.is_set():
                return
            try:
                self.reconcile()
            except Exception:  # a bug must not end the loop: log it, look again next pass
                LOG.exception("Kueue admission check pass failed")

    def reconcile(self) -> None:
        """One pass: mark our AdmissionChecks Active, then answer every Workload that has one
        (once the cache's first lists are in: before, every node would look empty)."""
        if not self._cache.synced.is_set():
            return
        with self._lock:
            inactive = [name for name, active in self._checks.items() if not active]
            names = set(self._checks)
            known = list(self._workloads.values())
        for name in inactive:
            self._activate(name)
        if not names:
            return
        workloads = [w for w in known if w.check(names) is not None]
        if not workloads:
            return
        admitted = [w for w in workloads if w.condition("Admitted") and _state(w, names) == "Ready"]
        faults = self._faults_by_owner() if admitted else {}
        flavors: dict[str, frozenset[str] | None] = {}
        free: dict[str, int] | None = None  # per node, read once per pass when a Workload needs it
        for workload in workloads:
            state = _state(workload, names)
            verdict: Verdict | None = None
            if state == "Ready" and workload in admitted:
                held = [f for key in self.owner_keys(workload) for f in faults.get(key, [])]
                verdict = verdict_for_faults(workload, held)
            elif state == "Pending" and workload.condition("QuotaReserved"):
                if free is None:
                    free = free_gpus_by_node(self._cache.states())
                verdict = self._admission_verdict(workload, flavors, self._not_avoided(workload, free))
            if verdict is not None:
                self._write(workload, names, verdict)

    def _admission_verdict(
        self, workload: Workload, flavors: dict[str, frozenset[str] | None], free: dict[str, int]
    ) -> Verdict:
        wanted = {f for a in workload.assignments for f in a.flavors.values()}
        for flavor in wanted - set(flavors):
            try:
                flavors[flavor] = self._flavor_nodes(flavor)
            except (ApiException, HTTPError) as exc:
                return Verdict("Pending", f"cannot read ResourceFlavor {flavor}: {describe(exc)}")
        selected = {f: n for f, n in flavors.items() if n is not None}
        try:
            needs = pod_set_needs(workload, selected)
        except InvalidInputError as exc:
            return Verdict("Pending", f"cannot read the workload's pods: {exc}")
        verdict = verdict_for_admission(needs, free)
        if verdict.state != "Ready" or self.preflight is None:
            return verdict
        return self._preflight_verdict(workload, placement_nodes(needs, free), verdict)

    def _not_avoided(self, workload: Workload, free: dict[str, int]) -> dict[str, int]:
        """``free`` without the nodes whose preflight failed for this Workload."""
        avoided = self.preflight.avoided(workload.key) if self.preflight is not None else frozenset()
        return {n: c for n, c in free.items() if n not in avoided} if avoided else free

    def _preflight_verdict(self, workload: Workload, nodes: Mapping[str, int], fits: Verdict) -> Verdict:
        """``Ready`` once each node the Workload's pods would take proved its free GPUs (a gang on
        more than one node; ``scheduler_ext.preflight``), else ``Pending`` saying why."""
        assert self.preflight is not None
        states = self._cache.states()
        gpus = {node: _free_gpu_uuids(states.get(node)) for node in nodes}
        verdict = self.preflight.check(workload.key, gpus)
        if verdict.state == "passed":
            if len(nodes) > 1:
                self.preflight.forget(workload.key)
            return fits
        reason = verdict.reason(f"workload {workload.key}").replace("gang workload", "workload")
        return Verdict("Pending", reason)

    def _flavor_nodes(self, flavor: str) -> frozenset[str] | None:
        """The nodes a ResourceFlavor's ``nodeLabels`` select; None when it has none (any node)."""
        get = self._custom.get_cluster_custom_object
        obj: Any = get(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", flavor)
        labels = (obj.get("spec") or {}).get("nodeLabels") or {}
        if not labels:
            return None
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        nodes = self._core.list_node(label_selector=selector)
        return frozenset(str(n.metadata.name) for n in nodes.items if n.metadata is not None)

    # ---- faults -> workloads ------------------------------------------------------------------
    def _faults_by_owner(self) -> dict[Owner, list[tuple[HeldFault, str]]]:
        """Each failed-and-held device, grouped by the owner of the Workload its pod belongs to."""
        found: dict[Owner, list[tuple[HeldFault, str]]] = {}
        for fault in held_faults(self._cache.states()):
            holding = self._cache.holding(fault.pod_uid)
            if holding is None:
                continue
            record = holding.record
            owner = self._pod_owner(record.uid, record.namespace, record.name)
            if owner is not None:
                found.setdefault(owner, []).append((fault, record.key))
        return found

    def _pod_owner(self, uid: str, namespace: str, name: str) -> Owner | None:
        """The Workload owner a fault under this pod requeues; None when the pod is not read yet,
        or when it asks not to be moved for a fault (``gpuweave.io/no-health-eviction=true``) or
        to move alone (``gpuweave.io/gang-eviction: pod``), as the node agent honours them."""
        if uid in self._owners:
            return self._owners[uid]
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except (ApiException, HTTPError) as exc:
            LOG.info("cannot read pod %s/%s to find its Workload: %s", namespace, name, describe(exc))
            return None  # not remembered: asked again next pass
        metadata = pod.metadata
        labels = (metadata.labels if metadata is not None else None) or {}
        annotations = (metadata.annotations if metadata is not None else None) or {}
        owner = requeue_owner(namespace, name, labels, annotations)
        self._owners[uid] = owner
        while len(self._owners) > MAX_REMEMBERED_PODS:
            self._owners.popitem(last=False)
        return owner

    @staticmethod
    def owner_keys(workload: Workload) -> list[Owner]:
        """What a pod of this Workload names: the Workload itself, its JobSet or Job; for a
        Workload of pods, its pod group (the Workload bears the group's name) or the one pod it
        was made for."""
        namespace, owner = workload.metadata.namespace, workload.owner()
        named: Owner = (namespace, "Workload", workload.metadata.name)
        if owner is None:
            return [named, (namespace, "group", workload.metadata.name)]
        if owner[0] == "Pod":
            return [named, (namespace, "group", workload.metadata.name), (namespace, "Pod", owner[1])]
        return [named, (namespace, owner[0], owner[1])]

    # ---- writes -----------------------------------------------------------------------------
    def _write(self, workload: Workload, names: set[str], verdict: Verdict) -> None:
        current = workload.check(names)
        assert current is not None
        if current.state == verdict.state and current.message == verdict.message:
            return
        entry = {
            "name": current.name,
            "state": verdict.state,
            "message": verdict.message,
            "lastTransitionTime": (
                current.last_transition
                if current.state == verdict.state and current.last_transition
                else _now()
            ),
        }
        # the verdict is about the Workload as read: a newer one (Kueue admitted it since, or reset
        # the check) refuses the write with 409 and is decided again next pass
        metadata = {
            "name": workload.metadata.name,
            "namespace": workload.metadata.namespace,
            "resourceVersion": workload.metadata.resource_version,
        }
        try:
            self._apply_status("Workload", metadata, {"admissionChecks": [entry]})
        except (ApiException, HTTPError) as exc:
            if status_of(exc) == CONFLICT:
                LOG.info("Workload %s changed since it was read; deciding again", workload.key)
                return
            LOG.warning("cannot set check %s of Workload %s: %s", current.name, workload.key, describe(exc))
            return
        LOG.info("Workload %s: check %s %s: %s", workload.key, current.name, verdict.state, verdict.message)

    def _activate(self, name: str) -> None:
        condition = {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": "the gpuweave extender serves this check",
            "lastTransitionTime": _now(),
        }
        try:
            self._apply_status("AdmissionCheck", {"name": name}, {"conditions": [condition]})
        except (ApiException, HTTPError) as exc:
            LOG.warning("cannot mark AdmissionCheck %s Active: %s", name, describe(exc))

    def _apply_status(self, kind: str, metadata: dict[str, str], status: dict[str, Any]) -> None:
        """Server-side apply of ``status`` (only the fields given, as field manager
        ``gpuweave-kueue-check``) to a Kueue object: a Workload (namespaced) or an AdmissionCheck."""
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": kind,
            "metadata": metadata,
            "status": status,
        }
        options: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force": True,
            "_content_type": APPLY_PATCH,
        }
        if kind == "Workload":
            self._custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                metadata["namespace"],
                "workloads",
                metadata["name"],
                body,
                **options,
            )
        else:
            self._custom.patch_cluster_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", metadata["name"], body, **options
            )


def _free_gpu_uuids(state: NodeState | None) -> list[str]:
    """The node's healthy GPUs nothing holds, by UUID (what its preflight checks)."""
    if state is None or state.index is None:
        return []
    uuids = state.index.gpu_uuids
    return sorted(uuids[i] for i in state.free.free_gpus)[:MAX_GPUS]


def _state(workload: Workload, names: set[str]) -> str:
    check = workload.check(names)
    return check.state if check is not None else ""


def requeue_owner(
    namespace: str, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> Owner | None:
    """The Workload owner a fault under this pod requeues; None when the pod opts out of health
    eviction or moves alone."""
    view = {"metadata": {"namespace": namespace, "labels": labels, "annotations": annotations}}
    if labels.get(ANNOTATION_OPT_OUT_EVICTION) == "true" or not evicts_whole_gang(view):
        return None
    return owner_of_pod(namespace, name, labels, annotations)


def owner_of_pod(
    namespace: str, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> Owner:
    """The Workload a pod belongs to: named by Kueue's ``kueue.x-k8s.io/workload`` annotation
    (on the pods of every admitted Workload while Topology Aware Scheduling is on, Kueue's
    default), else by the owner the labels its controller set name."""
    workload = (annotations or {}).get(ANNOTATION_KUEUE_WORKLOAD)
    if workload:
        return (namespace, "Workload", workload)
    if labels.get(LABEL_JOBSET_NAME):
        return (namespace, "JobSet", labels[LABEL_JOBSET_NAME])
    if labels.get(LABEL_KUEUE_POD_GROUP):
        return (namespace, "group", labels[LABEL_KUEUE_POD_GROUP])
    job = labels.get(LABEL_JOB) or labels.get(LABEL_JOB_LEGACY)
    if job:
        return (namespace, "Job", job)
    return (namespace, "Pod", name)
