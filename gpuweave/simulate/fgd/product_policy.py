"""kube-scheduler's side around the real extender, as a placement policy for trace experiments.

``ProductPolicy.choose`` is one scheduling cycle: the candidates (nodes NodeResourcesFit's filter
passes, computed by the caller from the cluster arrays) go through the extender's filter and
prioritize; the host is the best node total of the gpuweave-scheduler profile (extender score x
weight x 10 + NodeResourcesFit MostAllocated), random among equal totals as kube-scheduler's
selectHost; bind records the assignment and its GPUs are the placement. Only nodes with the top
extender score can win (one extender point outweighs MostAllocated's whole range), so
MostAllocated is computed for those alone, with kube-scheduler's integer arithmetic.

``transport="http"`` sends the same calls as JSON to the extender served on 127.0.0.1 port 0:
the decision-equivalence test runs both and compares.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from devicemodel.assignment import PodAssignment, parent_gpu_of_share
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fgd.policies import Placement
from gpuweave.simulate.fgd.product import ProductPathError, objects_for, pod_for, trace_inventory
from gpuweave.simulate.scheduler_profile import ProfileScoring, load_profile_scoring
from scheduler_ext.api import (
    DEFAULT_KEEP,
    Extender,
    ExtenderArgs,
    ExtenderBindingArgs,
    SnapshotBinder,
    apply_objects,
    assemble,
    build_core,
)
from topology.fragmentation import IntArray, TargetWorkload


class ProductPolicy:
    """The extender's service objects placing trace pods (see the module docstring)."""

    name = "gpuweave"

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        workload: TargetWorkload | None = None,
        scoring: ProfileScoring | None = None,
        transport: str = "in-process",
    ) -> None:
        inventories = [trace_inventory(n) for n in nodes]
        cache, core = build_core(share_workload=workload)
        apply_objects(iter(objects_for(nodes, inventories)), cache)
        cache.synced.set()
        self.extender: Extender = assemble(cache, core, SnapshotBinder(cache), keep=DEFAULT_KEEP)
        self._scoring = scoring or load_profile_scoring()
        self._names = [n.name for n in nodes]
        self._index = {name: i for i, name in enumerate(self._names)}
        self._gpu_index = {g.uuid: g.index for inv in inventories for g in inv.gpus}
        self._pods = 0
        self._connection: http.client.HTTPConnection | None = None
        if transport == "http":
            self.extender.serve(host="127.0.0.1", port=0)
            assert self.extender.server is not None
            host, port = self.extender.server.server_address[:2]
            self._connection = http.client.HTTPConnection(str(host), int(port), timeout=30)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self.extender.close()

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        self._pods += 1
        uid = f"trace-pod-{self._pods}"
        pod = pod_for(request, uid=uid)
        names = [self._names[i] for i in candidates]
        if request.gpu_count == 0:
            return self._place_host_only(cluster, request, pod, names=names, rng=rng)
        passed = self._filter(pod, names)
        if not passed:
            raise ProductPathError(
                f"the extender rejected all {len(names)} nodes kube-scheduler found room on for {uid} "
                f"({request}); the extender's view and the cluster arrays disagree"
            )
        hosts, scores = self._prioritize(pod, passed)
        node = self._select_host(cluster, request, hosts=hosts, scores=scores, rng=rng)
        error = self._bind(uid, self._names[node])
        if error:
            raise ProductPathError(f"bind of {uid} to {self._names[node]} failed: {error}")
        return Placement(node, self._gpus_of(uid))

    def _place_host_only(
        self,
        cluster: ClusterState,
        request: Request,
        pod: dict[str, Any],
        *,
        names: list[str],
        rng: np.random.Generator,
    ) -> Placement:
        """A pod asking for no GPU: prioritize only (the every-pod extender entry, docs/extender.md),
        kube-scheduler binds it, and the extender's pod watch then counts its CPU and memory."""
        hosts, scores = self._prioritize(pod, names)
        node = self._select_host(cluster, request, hosts=hosts, scores=scores, rng=rng)
        pod["spec"]["nodeName"] = self._names[node]
        self.extender.cache.upsert_pod(pod)
        return Placement(node, ())

    # ---- the extender's verbs, in-process or over HTTP ---------------------------------------------
    def _filter(self, pod: dict[str, Any], names: list[str]) -> list[str]:
        if self._connection is not None:
            return list(
                self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})["NodeNames"] or []
            )
        args = ExtenderArgs.model_construct(Pod=None, Nodes=None, NodeNames=names)
        return list(self.extender.service.filter(args, pod).NodeNames or [])

    def _prioritize(self, pod: dict[str, Any], names: list[str]) -> tuple[list[str], list[int]]:
        if self._connection is not None:
            answer = self._post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names}) or []
            return [a["Host"] for a in answer], [int(a["Score"]) for a in answer]
        args = ExtenderArgs.model_construct(Pod=None, Nodes=None, NodeNames=names)
        return self.extender.service.prioritize(args, pod)

    def _bind(self, uid: str, node: str) -> str:
        binding = {"PodName": uid, "PodNamespace": "default", "PodUID": uid, "Node": node}
        if self._connection is not None:
            return str(self._post("bind", binding).get("Error") or "")
        args = ExtenderBindingArgs.model_construct(PodName=uid, PodNamespace="default", PodUID=uid, Node=node)
        return self.extender.service.bind(args)

    def _post(self, verb: str, body: dict[str, Any]) -> Any:
        assert self._connection is not None
        self._connection.request(
            "POST", f"/{verb}", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        response = self._connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise ProductPathError(f"extender /{verb} answered HTTP {response.status}: {data[:200]!r}")
        return json.loads(data)

    # ---- kube-scheduler's part -----------------------------------------------------------------
    def _select_host(
        self,
        cluster: ClusterState,
        request: Request,
        *,
        hosts: list[str],
        scores: list[int],
        rng: np.random.Generator,
    ) -> int:
        top = max(scores)
        best = np.asarray([self._index[h] for h, s in zip(hosts, scores, strict=True) if s == top])
        return self._pick(cluster, request, nodes=best, extender_score=top, rng=rng)

    def _pick(
        self,
        cluster: ClusterState,
        request: Request,
        *,
        nodes: IntArray,
        extender_score: int,
        rng: np.random.Generator,
    ) -> int:
        """selectHost among ``nodes`` (equal extender scores): the best profile total, ties at random."""
        totals = self._scoring.node_total(extender_score=extender_score, fit_score=0) + (
            self._most_allocated(cluster, nodes, request) * self._scoring.fit_weight
        )
        winners = nodes[totals == totals.max()]
        return int(winners[0]) if len(winners) == 1 else int(winners[rng.integers(len(winners))])

    def _most_allocated(self, cluster: ClusterState, nodes: IntArray, request: Request) -> IntArray:
        """NodeResourcesFit's MostAllocated for each node, kube-scheduler's integer arithmetic.

        The trace's pods request cpu and memory and no whole-GPU resource (shares are
        ``gpuweave.io/gpu-compute``), so the profile's ``nvidia.com/gpu`` weight is skipped as
        kube-scheduler skips an extended resource the pod does not request.
        """
        asked = {"cpu": request.cpu_milli, "memory": request.memory_mib}
        arrays = {
            "cpu": (cluster.cpu_capacity[nodes], cluster.cpu_free[nodes]),
            "memory": (cluster.memory_capacity[nodes], cluster.memory_free[nodes]),
        }
        total = np.zeros(len(nodes), dtype=np.int64)
        weights = 0
        for name, weight in self._scoring.fit_resources:
            if name not in arrays:
                continue
            capacity, free = arrays[name]
            used = np.minimum(capacity - free + asked[name], capacity)
            total += used * 100 // np.maximum(capacity, 1) * weight
            weights += weight
        result: IntArray = total // weights if weights else total
        return result

    def _gpus_of(self, uid: str) -> tuple[int, ...]:
        bound = self.extender.cache.pod_object(uid=uid) or {}
        annotation = (bound.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ASSIGNMENT)
        if not annotation:
            return ()
        assignment = PodAssignment.from_annotation(annotation)
        uuids = {parent_gpu_of_share(d) or d for d in assignment.all_device_ids()}
        return tuple(sorted(self._gpu_index[u] for u in uuids if u in self._gpu_index))
