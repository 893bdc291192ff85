"""The real gpuweave extender, driven over HTTP as kube-scheduler drives it.

The extender runs in this process in snapshot mode on 127.0.0.1 port 0, fed the objects the node
agents publish (``nodeagent.published``: the GpuNodeInventory of each node, with device health)
plus Node objects. This side plays kube-scheduler: it checks CPU and memory itself (NodeResourcesFit),
then calls ``/filter``, ``/prioritize`` and ``/bind``, and reads the device choice
back from the ``gpuweave.io/assignment`` annotation the bind recorded. It also
plays the API server's watch: pod deletions and inventory changes (a failed GPU) reach the
extender's cache the way its informers would deliver them.

After a cycle in which the filter passed no node, ``preempt`` plays kube-scheduler's
DefaultPreemption: on the allowed nodes the filter called resolvable or this side's CPU/memory fit
refused (NodeResourcesFit's shortfall is resolvable where the node's allocatable holds the pod at
all: kube-scheduler since 1.34 calls a node too small for it unresolvable), from a random one on
and until it has ``candidates_to_find`` of them (100 below 1,000 such nodes: all of them on a
small cluster), its dry run takes the pods of lower priority away and gives back (highest
priority and longest-running first) every one the pod does not need gone for its CPU, memory and
GPU count; the extender's ``/preempt`` narrows or extends
those victims by device topology; the node whose victims have the lowest highest priority, then
the lowest sum of priorities, then the fewest pods, then the name, is chosen.

The winner of ``/prioritize`` is chosen as the gpuweave-scheduler profile would choose it: the
extender's score times its weight plus NodeResourcesFit's MostAllocated score
(``scheduler_profile``, weights from manifests/scheduler/scheduler-config.yaml), at random only
among nodes tied on that total.
"""

from __future__ import annotations

import copy
import http.client
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from devicemodel.assignment import PodAssignment, parent_gpu_of_share
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU, RESOURCE_GPU_COMPUTE, mig_resource_name
from devicemodel.errors import GpuweaveError
from devicemodel.gangs import ANNOTATION_EXPECTED_DURATION, ANNOTATION_GANG_TIER, MAX_EXPECTED_DURATION_S
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from devicemodel.spec import NodeProfileSpec
from gpuweave.simulate.cluster import ClusterState, Request
from gpuweave.simulate.cluster_objects import pod_object
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.placers import Gang, PodPlacement
from gpuweave.simulate.scheduler_profile import ProfileScoring, load_profile_scoring
from gpuweave.simulate.state import SimState
from nodeagent.published import inventory_object
from scheduler_ext.api import (
    DEFAULT_KEEP,
    DISRUPTION_CONDITION,
    PREEMPTED_REASON,
    Extender,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    GangSettings,
    SnapshotBinder,
    apply_objects,
    assemble,
    build_core,
    parse,
)
from topology.fragmentation import TargetWorkload

_NAME = re.compile(r"[^a-z0-9.-]+")
# How a pod names its gang (docs/pod-api.md): the job's name and its number of pods.
ANNOTATION_GANG = "gpuweave.io/gang"
ANNOTATION_GANG_SIZE = "gpuweave.io/gang-size"
# kube-scheduler's DefaultPreemptionArgs defaults (the gpuweave-scheduler profile keeps them)
MIN_CANDIDATE_NODES_PERCENTAGE = 10
MIN_CANDIDATE_NODES_ABSOLUTE = 100
PREEMPT_OFFSET_SEED = 0
_UNKNOWN: Any = object()  # no dry run kept yet


class ExtenderCallError(GpuweaveError):
    """The extender answered a verb with an HTTP error or an error message."""


def _node_object(node: FleetNode) -> dict[str, Any]:
    allocatable = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": "110",
        RESOURCE_GPU: str(node.gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "uid": f"uid-node-{node.name}", "labels": dict(node.labels)},
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


class ExtenderPlacer:
    """kube-scheduler's side of the extender protocol, for the simulation's scheduling loop."""

    name = "gpuweave"
    transport = "extender over HTTP"

    def __init__(
        self,
        fleet: Sequence[FleetNode],
        *,
        share_nodes: frozenset[int],
        share_workload: TargetWorkload | None = None,
        scoring: ProfileScoring | None = None,
        transport: str = "http",
        absent: Collection[int] = (),
    ) -> None:
        """``share_workload`` pins the scorer's mix (else it learns from the pods it sees);
        ``transport="in-process"`` calls the same service objects without HTTP; rows ``absent``
        hold no machine yet (``node_joined`` registers one)."""
        self._fleet = tuple(fleet)
        self._absent = set(absent)
        self._scoring = scoring or load_profile_scoring()
        self._allocatable = [
            {"cpu": n.cpu_milli, "memory": n.memory_mib, RESOURCE_GPU: n.gpus} for n in self._fleet
        ]
        self._node_of = {n.name: i for i, n in enumerate(self._fleet)}
        self._names = np.array([n.name for n in self._fleet], dtype=object)  # a mask picks names at C speed
        # What kube-scheduler's NodeInfo.Requested holds: the requests of the pods bound per node
        self._bound: dict[str, tuple[int, dict[str, int]]] = {}
        self._requested: list[dict[str, int]] = [{} for _ in self._fleet]
        self.tie_counts = {"prioritize": 0, "extender_tied": 0, "profile_tied": 0}
        self._share_nodes = share_nodes
        self._faults: dict[int, dict[str, str]] = {}
        self._mig_mode: dict[int, dict[str, str]] = {}
        self._published: dict[int, NodeInventory] = {}  # what node agents rediscovered (MIG devices)
        self._gpu_of: dict[str, tuple[int, int]] = {
            gpu.uuid: (i, gpu.index) for i, node in enumerate(fleet) for gpu in node.inventory.gpus
        }
        # Gang reservations expire on the simulated clock, not the wall clock (a 6 h run takes a minute)
        self.now_s = 0.0
        # pods' start times are written on the simulated clock too (``_started``)
        gangs = GangSettings(clock=lambda: self.now_s, wall_clock=lambda: self.now_s)
        cache, core = build_core(share_workload=share_workload, gangs=gangs)
        apply_objects(iter(self._objects()), cache)
        self._extender: Extender = assemble(
            cache, core, SnapshotBinder(cache), keep=DEFAULT_KEEP, gangs=gangs
        )
        self._connection: http.client.HTTPConnection | None = None
        self.calls = 0
        self.reconnects = 0  # idle keep-alive connections the extender had closed
        self._pod_ids: dict[str, str] = {}  # extender UID -> the simulation's pod ID
        self._unplaced: tuple[dict[str, Any], list[str]] | None = None  # last pod no node passed for
        # DefaultPreemption's random offset into the potential nodes (drawn only where it matters:
        # more potential nodes than candidates to find), apart from the placement draws
        self._preempt_rng = np.random.default_rng(PREEMPT_OFFSET_SEED)
        # node -> (its state's version, {request key: dry run's MetaVictims}): a node whose pods
        # and GPU modes did not change gives the same victims, and waiting gangs ask every tick;
        # a (request, priority) is keyed by a number (hashing the pair per node cost more than the rest)
        self._dry_runs: dict[int, tuple[int, dict[int, dict[str, Any] | None]]] = {}
        self._dry_run_keys: dict[tuple[Request, int], int] = {}
        if transport == "in-process":
            self.transport = "extender in-process"
            return
        self.url = self._extender.serve(host="127.0.0.1", port=0)
        assert self._extender.server is not None
        host, port = self._extender.server.server_address[:2]
        self._connection = http.client.HTTPConnection(str(host), int(port), timeout=30)

    def _sharing(self, node: int) -> SharingPlan:
        mode = SharingMode.FRACTIONAL if node in self._share_nodes else SharingMode.EXCLUSIVE
        return SharingPlan(default=GpuSharing(mode))

    def _node_inventory(self, node: int) -> NodeInventory:
        return self._published.get(node, self._fleet[node].inventory)

    def _inventory(self, node: int) -> dict[str, Any]:
        return inventory_object(
            self._node_inventory(node),
            sharing=self._sharing(node),
            faults=self._faults.get(node, {}),
            withheld=self._mig_mode.get(node, {}),
        )

    def _objects(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for i, node in enumerate(self._fleet):
            if i not in self._absent:
                items += [_node_object(node), self._inventory(i)]
        return items

    def node_joined(self, node: int, machine: FleetNode, *, shared: bool, inventory: bool) -> None:
        """A new machine registered in row ``node``: its Node object reaches the cache as the
        watch delivers it, and its ``GpuNodeInventory`` too where no agent publishes one
        (``inventory``); its GPUs are known by their own UUIDs."""
        self._fleet = (*self._fleet[:node], machine, *self._fleet[node + 1 :])
        self._absent.discard(node)
        self._allocatable[node] = {
            "cpu": machine.cpu_milli,
            "memory": machine.memory_mib,
            RESOURCE_GPU: machine.gpus,
        }
        self._node_of[machine.name] = node
        self._names[node] = machine.name
        self._gpu_of.update({gpu.uuid: (node, gpu.index) for gpu in machine.inventory.gpus})
        self._share_nodes = self._share_nodes | {node} if shared else self._share_nodes - {node}
        self._extender.cache.upsert_node(_node_object(machine))
        if inventory:
            self._extender.cache.upsert_inventory(self._inventory(node))

    def node_left(self, node: int) -> None:
        """The machine of row ``node`` is gone (drained before): its Node and inventory deleted."""
        gone = self._fleet[node]
        self._absent.add(node)
        self._extender.cache.delete_inventory(gone.name)
        self._extender.cache.delete_node(gone.name)
        self._node_of.pop(gone.name, None)
        for gpu in gone.inventory.gpus:
            self._gpu_of.pop(gpu.uuid, None)
        for per_node in (self._published, self._faults, self._mig_mode, self._dry_runs):
            per_node.pop(node, None)
        self._requested[node] = {}

    def _post(self, verb: str, body: Mapping[str, Any]) -> Any:
        self.calls += 1
        if self._connection is None:
            return self._call(verb, body)
        payload = orjson.dumps(body)
        try:
            data, status = self._send(verb, payload)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The extender drops a keep-alive connection left idle past its read timeout
            # (``ExtenderHandler.timeout``: a wait in the simulation's loop can take that long on
            # a loaded machine); the request never reached a handler. Like kube-scheduler's HTTP
            # client, open a new connection and send it once more.
            self._connection.close()
            self.reconnects += 1
            data, status = self._send(verb, payload)
        if status != 200:
            raise ExtenderCallError(f"extender /{verb} answered HTTP {status}: {data[:200]!r}")
        return orjson.loads(data)

    def _send(self, verb: str, payload: bytes) -> tuple[bytes, int]:
        assert self._connection is not None
        self._connection.request(
            "POST", f"/{verb}", body=payload, headers={"Content-Type": "application/json"}
        )
        response = self._connection.getresponse()
        return response.read(), response.status

    def _call(self, verb: str, body: Mapping[str, Any]) -> Any:
        """The verb on the service objects, with the JSON shapes the HTTP adapter would return."""
        service = self._extender.service
        if verb == "bind":
            return {"Error": service.bind(parse(ExtenderBindingArgs, body))}
        if verb == "preempt":
            return service.preempt(parse(ExtenderPreemptionArgs, body), body["Pod"]).model_dump()
        args = parse(ExtenderArgs, body)
        if verb == "filter":
            return service.filter(args, body["Pod"]).model_dump()
        hosts, scores = service.prioritize(args, body["Pod"])
        return [{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)]

    def place(
        self,
        state: SimState,
        request: Request,
        *,
        allowed: np.ndarray,
        rng: np.random.Generator,
        pod_id: str = "",
        gang: Gang | None = None,
    ) -> PodPlacement | None:
        cluster = state.cluster
        fits = (cluster.cpu_free >= request.cpu_milli) & (cluster.memory_free >= request.memory_mib) & allowed
        names: list[str] = self._names[fits].tolist()
        uid = _NAME.sub("-", pod_id.lower()) or f"pod-{self.calls}"
        pod = self._pod(uid, request, gang)
        self._pod_ids[uid] = pod_id
        # NodeResourcesFit's refusal is resolvable by eviction only where the node's allocatable
        # holds the pod at all (kube-scheduler >= 1.34 calls a node too small unresolvable)
        roomy = allowed & _large_enough(cluster, request)
        if not names:
            # kube-scheduler's own filters (CPU, memory) passed no node, so the extender's filter is
            # not called; its preemption may still free room on the allowed nodes, for this pod
            self._unplaced = (pod, self._names[roomy].tolist())
            return None
        placed = self._schedule(pod, uid, names, rng, requests=self._requests(request))
        if placed is None and self._unplaced is not None:
            # kube-scheduler's preemption also considers the allowed nodes its own CPU/memory fit
            # refused (NodeResourcesFit's Insufficient cpu/memory is resolvable by evicting pods)
            unfit: list[str] = self._names[roomy & ~fits].tolist()
            self._unplaced = (pod, sorted({*self._unplaced[1], *unfit}))
        return placed

    def _pod(self, uid: str, request: Request, gang: Gang | None) -> dict[str, Any]:
        """The pending pod kube-scheduler sends: every training job names its gang, a one-pod job
        too (a gang of one: placed as any pod, it preempts only when re-created after a fault, under
        the same name); any other job of a priority above 0 carries only the priority."""
        annotations = (
            {ANNOTATION_GANG: _NAME.sub("-", gang.name.lower()), ANNOTATION_GANG_SIZE: str(gang.size)}
            if gang is not None and gang.named
            else None
        )
        if annotations is not None and gang is not None and gang.tier:
            annotations[ANNOTATION_GANG_TIER] = gang.tier  # e.g. every member inside one NVLink clique
        if annotations is not None and gang is not None and gang.duration_s >= 1:
            # the job's run time as its user would estimate it: its drawn time on the best set
            annotations[ANNOTATION_EXPECTED_DURATION] = f"{min(gang.duration_s, MAX_EXPECTED_DURATION_S):.0f}"
        priority = gang.priority if gang is not None else 0
        limits = self._limits(request)
        return pod_object(uid, uid=uid, limits=limits, annotations=annotations, priority=priority)

    def created(self, pod_ids: Sequence[str], request: Request, gang: Gang) -> None:
        """A job's pods were created, pending: the extender's watch delivers them before any of
        them is scheduled (a gang is planned only once its members exist)."""
        for pod_id in pod_ids:
            uid = _NAME.sub("-", pod_id.lower())
            if self._extender.cache.pod_object(uid=uid) is None and uid not in self._bound:
                self._extender.cache.upsert_pod(self._pod(uid, request, gang))

    def evicted(self, pod_id: str, *, preempted: bool = False) -> None:
        """The pod is evicted (a fault's, or a preemption's): the ``DisruptionTarget`` condition is
        set before the delete, and the watch delivers that update; ``forget`` delivers the delete.
        Its reason is the writer's: kube-scheduler's preemption writes ``PreemptionByScheduler``
        on its victims, the API server's Eviction (a fault's or a drain's) ``EvictionByEvictionAPI``."""
        uid = _NAME.sub("-", pod_id.lower())
        bound = self._extender.cache.pod_object(uid=uid)
        if bound is None:
            return
        disrupted = copy.deepcopy(dict(bound))
        status = disrupted.setdefault("status", {})
        reason = PREEMPTED_REASON if preempted else "EvictionByEvictionAPI"
        condition = {"type": DISRUPTION_CONDITION, "status": "True", "reason": reason}
        status["conditions"] = [*status.get("conditions", []), condition]
        self._extender.cache.upsert_pod(disrupted)
        self._extender.cache.remember_pod(disrupted)  # offline, the cache is the record (SnapshotBinder)

    def place_mig(
        self, profile: str, *, allowed: np.ndarray, rng: np.random.Generator, pod_id: str
    ) -> PodPlacement | None:
        """A pod asking for one ``nvidia.com/mig-<profile>`` device, among the allowed nodes."""
        names: list[str] = self._names[allowed].tolist()
        if not names:
            return None
        uid = _NAME.sub("-", pod_id.lower())
        pod = pod_object(uid, uid=uid, limits={mig_resource_name(profile): 1})
        return self._schedule(pod, uid, names, rng, requests={})

    def _schedule(
        self,
        pod: dict[str, Any],
        uid: str,
        names: list[str],
        rng: np.random.Generator,
        *,
        requests: dict[str, int],
    ) -> PodPlacement | None:
        """filter, prioritize, bind: as kube-scheduler calls them; the profile's total picks the host."""
        answer = self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        passed = answer.get("NodeNames") or []
        if not passed:
            self._unplaced = (pod, sorted(answer.get("FailedNodes") or {}))
            return None
        self._unplaced = None
        scores = self._post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed}) or []
        host = self._select_host({s["Host"]: int(s["Score"]) for s in scores}, requests, rng)
        binding = {"PodName": uid, "PodNamespace": "default", "PodUID": uid, "Node": host}
        error = self._post("bind", binding).get("Error")
        if error:
            return None
        self._remember(uid, self._node_of[host], requests)
        self._started(uid)
        return self._placement(uid, host)

    def _started(self, uid: str) -> None:
        """The kubelet starts the bound pod: the watch delivers its ``status.startTime`` (what a
        gang's wait for its tightest tier counts the pod's end from)."""
        bound = self._extender.cache.pod_object(uid=uid)
        if bound is None:
            return
        status = {**(bound.get("status") or {}), "phase": "Running", "startTime": _rfc3339(self.now_s)}
        running = {**bound, "status": status}
        self._extender.cache.upsert_pod(running)
        self._extender.cache.remember_pod(running)  # offline, the cache is the record (SnapshotBinder)

    def tier_decisions(self) -> dict[str, int] | None:
        """How many gangs waited for their tightest tier, how many took a looser one (None: gangs off)."""
        gangs = self._extender.gangs
        if gangs is None or gangs.tier_waits is None:
            return None
        return dict(gangs.tier_waits.counts)

    def preempt(
        self,
        state: SimState,
        request: Request,
        *,
        allowed: np.ndarray,
        priority: int,
    ) -> list[str]:
        """kube-scheduler's preemption for the pod whose filter passed no node last (module doc):
        the simulation's IDs of the pods to evict, [] when no node's eviction helps."""
        if self._unplaced is None:
            return []
        pod, resolvable = self._unplaced
        self._unplaced = None
        potential = [name for name in resolvable if allowed[self._node_of[name]]]
        wanted = candidates_to_find(len(potential))
        if len(potential) > wanted:  # kube-scheduler starts its dry runs at a random node
            offset = int(self._preempt_rng.integers(len(potential)))
            potential = potential[offset:] + potential[:offset]
        proposed: dict[str, dict[str, Any]] = {}
        key = self._dry_run_keys.setdefault((request, priority), len(self._dry_run_keys))
        versions, runs, node_of = state.node_versions, self._dry_runs, self._node_of
        for name in potential:
            # the node's dry run for this request and priority, kept until its pods or GPU modes change
            node = node_of[name]
            version = versions.get(node, 0)
            cached = runs.get(node)
            if cached is None or cached[0] != version:
                cached = runs[node] = (version, {})
            meta = cached[1].get(key, _UNKNOWN)
            if meta is _UNKNOWN:
                meta = cached[1][key] = self._meta_victims(_dry_run(state, node, request, priority))
            if meta is not None:
                proposed[name] = meta
                if len(proposed) >= wanted:  # as many candidates as kube-scheduler looks for
                    break
        if not proposed:
            return []
        body = {"Pod": pod, "NodeNameToMetaVictims": proposed}
        answer = self._post("preempt", body).get("NodeNameToMetaVictims") or {}
        candidates = []
        for name, meta in answer.items():
            victims = [self._pod_ids.get(str(p["UID"]), str(p["UID"])) for p in meta.get("Pods") or []]
            ranks = [state.pods[v].job.priority for v in victims if v in state.pods]
            if len(ranks) == len(victims):
                candidates.append((max(ranks, default=0), sum(ranks), len(victims), name, victims))
        if not candidates:
            return []
        return min(candidates)[-1]

    @staticmethod
    def _meta_victims(victims: list[str] | None) -> dict[str, Any] | None:
        """A dry run's victims as ``/preempt``'s ``MetaVictims`` (their pod UIDs), None for none."""
        if victims is None:
            return None
        return {"Pods": [{"UID": _NAME.sub("-", v.lower())} for v in victims], "NumPDBViolations": 0}

    def _select_host(
        self, extender_scores: dict[str, int], requests: dict[str, int], rng: np.random.Generator
    ) -> str:
        """kube-scheduler's selectHost over extender x weight + NodeResourcesFit (MostAllocated)."""
        totals = {
            host: self._scoring.node_total(
                extender_score=score,
                fit_score=self._scoring.most_allocated(
                    requested=self._requested[self._node_of[host]],
                    allocatable=self._allocatable[self._node_of[host]],
                    pod=requests,
                ),
            )
            for host, score in extender_scores.items()
        }
        top_extender = max(extender_scores.values())
        top = max(totals.values())
        best = [host for host, total in totals.items() if total == top]
        self.tie_counts["prioritize"] += 1
        self.tie_counts["extender_tied"] += sum(s == top_extender for s in extender_scores.values()) > 1
        self.tie_counts["profile_tied"] += len(best) > 1
        return best[int(rng.integers(len(best)))]

    def _remember(self, uid: str, node: int, requests: dict[str, int]) -> None:
        self._bound[uid] = (node, requests)
        for name, amount in requests.items():
            self._requested[node][name] = self._requested[node].get(name, 0) + amount

    @staticmethod
    def _limits(request: Request) -> dict[str, int | str]:
        limits: dict[str, int | str] = {"cpu": f"{request.cpu_milli}m", "memory": f"{request.memory_mib}Mi"}
        if request.is_share:
            limits[RESOURCE_GPU_COMPUTE] = max(1, request.gpu_milli // 10)
        elif request.gpu_count:
            limits[RESOURCE_GPU] = request.gpu_count
        return limits

    @staticmethod
    def _requests(request: Request) -> dict[str, int]:
        """The pod's requests as NodeResourcesFit counts them (cpu in milli, memory in MiB)."""
        requests = {"cpu": request.cpu_milli, "memory": request.memory_mib}
        if request.gpu_count and not request.is_share:
            requests[RESOURCE_GPU] = request.gpu_count
        return requests

    def _placement(self, uid: str, host: str) -> PodPlacement:
        bound = self._extender.cache.pod_object(uid=uid) or {}
        annotation = (bound.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ASSIGNMENT)
        node = self._node_of[host]
        if not annotation:
            return PodPlacement(node, ())
        assignment = PodAssignment.from_annotation(annotation)
        by_resource: dict[str, tuple[str, ...]] = {}
        for container in assignment.containers.values():
            for resource, ids in container.devices.items():
                by_resource[resource] = by_resource.get(resource, ()) + tuple(ids)
        mig_parent = {m.uuid: m.parent_uuid for m in self._node_inventory(node).mig_devices}
        uuids = {mig_parent.get(d) or parent_gpu_of_share(d) or d for d in assignment.all_device_ids()}
        gpus = tuple(sorted(self._gpu_of[u][1] for u in uuids if u in self._gpu_of))
        return PodPlacement(node, gpus, by_resource)

    def forget(self, pod_id: str) -> None:
        """The pod is gone (finished, evicted or rolled back): as the pod informer would say."""
        uid = _NAME.sub("-", pod_id.lower())
        self._extender.cache.delete_pod(uid)
        node, requests = self._bound.pop(uid, (-1, {}))
        for name, amount in requests.items():
            self._requested[node][name] -= amount

    def gpu_failed(self, node: int, gpu: int, reason: str) -> None:
        """The node agent republishes its inventory with the GPU unhealthy."""
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        self._faults.setdefault(node, {})[uuid] = reason
        self._extender.cache.upsert_inventory(self._inventory(node))

    def gpu_restored(self, node: int, gpu: int) -> None:
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        self._faults.get(node, {}).pop(uuid, None)
        self._extender.cache.upsert_inventory(self._inventory(node))

    def set_time(self, now_s: float) -> None:
        """The simulated clock, which the extender's gang reservations (their TTL) run on."""
        self.now_s = now_s

    def receive_inventory(self, node: int, obj: Mapping[str, Any]) -> None:
        """A ``GpuNodeInventory`` a node agent published, as the extender's watch delivers it:
        the extender learns device health (faults, recoveries) and new MIG devices only so."""
        name = str(obj["metadata"]["name"])
        self._published[node] = NodeProfileSpec.parse(obj["spec"], source=name).to_inventory(node_name=name)
        self._extender.cache.upsert_inventory(dict(obj))

    def publish_inventory(self, node: int, inventory: NodeInventory) -> None:
        """The node agent republished its inventory (after a MIG reshape: the new MIG devices)."""
        self._published[node] = inventory
        self._extender.cache.upsert_inventory(self._inventory(node))

    def gpu_mode_changed(self, node: int, gpu: int, *, mig: bool) -> None:
        """A GPU went into (or out of) MIG mode: whole-GPU and share pods may not use it meanwhile.

        MIG pods are bound by the simulation's MIG manager, not through the extender, so the GPU is
        published as withheld from whole-GPU work rather than with its MIG devices.
        """
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        if mig:
            self._mig_mode.setdefault(node, {})[uuid] = "MIG mode"
        else:
            self._mig_mode.get(node, {}).pop(uuid, None)
        self._extender.cache.upsert_inventory(self._inventory(node))

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._extender.close()


def candidates_to_find(potential: int) -> int:
    """How many preemption candidates kube-scheduler's DefaultPreemption collects before it stops
    dry-running nodes: ``minCandidateNodesPercentage`` (10) of the potential nodes, at least
    ``minCandidateNodesAbsolute`` (100), at most all of them (its defaults; the gpuweave-scheduler
    profile does not change them)."""
    wanted = potential * MIN_CANDIDATE_NODES_PERCENTAGE // 100
    return min(max(wanted, MIN_CANDIDATE_NODES_ABSOLUTE), potential)


def _large_enough(cluster: ClusterState, request: Request) -> np.ndarray:
    """Per node, whether its allocatable CPU, memory and (for whole GPUs) GPU count hold the
    request when nothing else runs there."""
    large = (cluster.cpu_capacity >= request.cpu_milli) & (cluster.memory_capacity >= request.memory_mib)
    if request.gpu_count and not request.is_share:
        large &= cluster.gpu_count >= request.gpu_count
    return large


def _dry_run(state: SimState, node: int, request: Request, priority: int) -> list[str] | None:
    """kube-scheduler's victims on ``node``: every pod of lower priority taken away, then given back,
    most important first (higher priority, then earlier start), while the pod still fits its CPU,
    memory and GPU count; None when it does not fit even with them all gone."""
    lower = [p for p in state.pods_on(node) if p.request is not None and p.job.priority < priority]
    cluster = state.cluster
    free = [
        int(cluster.cpu_free[node]) + sum(p.request.cpu_milli for p in lower if p.request),
        int(cluster.memory_free[node]) + sum(p.request.memory_mib for p in lower if p.request),
        len(state.full_free_gpus(node)) + sum(len(p.gpus) for p in lower),
    ]
    need = (request.cpu_milli, request.memory_mib, request.gpu_count)
    if any(f < n for f, n in zip(free, need, strict=True)):
        return None
    victims: list[str] = []
    for pod in sorted(lower, key=lambda p: (-p.job.priority, p.started_s, p.pod_id)):
        assert pod.request is not None
        back = [free[0] - pod.request.cpu_milli, free[1] - pod.request.memory_mib, free[2] - len(pod.gpus)]
        if all(f >= n for f, n in zip(back, need, strict=True)):
            free = back
        else:
            victims.append(pod.pod_id)
    return victims


def _rfc3339(seconds: float) -> str:
    """Simulated seconds as the API server writes a time (the simulation starts at the epoch)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
