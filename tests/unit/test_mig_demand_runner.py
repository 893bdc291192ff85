"""The demand loop over the MIG service of a simulated DGX H100: claim first, reshape only after
winning, release when busy instances leave no room. Claims go to an in-memory store that answers
as the API server does (a stale resourceVersion loses)."""

from __future__ import annotations

from pathlib import Path

from hardware.simulated.lib import SimulatedNvmlLib
from mig.demand import Claim, PendingPod
from mig.demand_runner import DemandRunner
from mig.service import MigService
from tests.support.sim_mig import sim_mig_service

NOW = 1_800_000_000.0


class MemoryClaims:
    """Claims keyed by pod UID; a claim on a pod whose version moved on loses, as a 409 would."""

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}
        self.versions: dict[str, str] = {}
        self.released: list[str] = []

    def claim(self, pod: PendingPod, *, node: str, now: float) -> bool:
        if self.versions.get(pod.uid, pod.resource_version) != pod.resource_version:
            return False
        self.claims[pod.uid] = Claim(node, now)
        self.versions[pod.uid] = str(int(pod.resource_version) + 1)
        return True

    def release(self, pod: PendingPod, *, node: str) -> None:
        if self.claims.get(pod.uid, Claim("", None)).node == node:
            del self.claims[pod.uid]
            self.released.append(pod.uid)


def mig_service(tmp_path: Path) -> tuple[MigService, SimulatedNvmlLib]:
    service, lib = sim_mig_service(tmp_path)
    service.apply_declared('{"gpus": {"3": []}}')  # GPU 3 in MIG mode, no instances
    return service, lib


def pending(name: str, requests: dict[str, int], *, claim: Claim | None = None) -> PendingPod:
    return PendingPod("work", name, f"uid-{name}", "1", "Pending", True, requests=requests, claim=claim)


def runner(service: MigService, claims: MemoryClaims, node: str) -> DemandRunner:
    return DemandRunner(service, claims, node=node, clock=lambda: NOW)


def test_the_first_node_to_claim_reshapes_the_second_loses_and_changes_nothing(tmp_path):
    (a, _), (b, _) = mig_service(tmp_path / "a"), mig_service(tmp_path / "b")
    claims = MemoryClaims()
    pod = pending("p", {"1g.10gb": 2})
    [won] = runner(a, claims, "node-a").run_once([pod], {})
    [lost] = runner(b, claims, "node-b").run_once([pod], {})  # same (now stale) resourceVersion
    assert (won.outcome, lost.outcome) == ("served", "lost")
    assert [c.profile for c in won.results[0].created] == ["1g.10gb", "1g.10gb"]
    assert len(a.reconciler.current(3)) == 2 and b.reconciler.current(3) == ()
    assert claims.claims["uid-p"] == Claim("node-a", NOW)


def test_held_claims_count_so_a_second_pod_gets_its_own_instance(tmp_path):
    service, _ = mig_service(tmp_path)
    claims = MemoryClaims()
    run = runner(service, claims, "node-a")
    run.run_once([pending("p1", {"3g.40gb": 1})], {})
    held = pending("p1", {"3g.40gb": 1}, claim=Claim("node-a", NOW))
    [second] = run.run_once([held, pending("p2", {"3g.40gb": 1})], {})
    assert second.outcome == "served"
    assert sorted(i.profile for i in service.reconciler.current(3)) == ["3g.40gb", "3g.40gb"]


def test_busy_instances_in_the_way_release_the_claim_and_the_pod_waits_a_lifetime(tmp_path):
    service, lib = mig_service(tmp_path)
    service.apply_declared('{"gpus": {"3": ["3g.40gb@0", "3g.40gb@4"]}}')
    assert lib.mig_node is not None
    for record in service.reconciler.snapshot(3).records:
        lib.mig_node.gpus[3].set_busy(record.computes[0].mig_uuid)
    claims = MemoryClaims()
    run = runner(service, claims, "node-a")
    pod = pending("big", {"7g.80gb": 1})
    [outcome] = run.run_once([pod], {})
    assert outcome.outcome == "released" and "busy" in outcome.reason
    assert claims.released == ["uid-big"] and "uid-big" not in claims.claims
    assert sorted(i.start for i in service.reconciler.current(3)) == [0, 4]  # untouched
    assert run.run_once([pending("big", {"7g.80gb": 1})], {}) == []  # not retried at once


def test_an_idle_instance_already_serving_keeps_the_claim_without_a_reshape(tmp_path):
    service, _ = mig_service(tmp_path)
    service.apply_declared('{"gpus": {"3": ["1g.10gb@6"]}}')
    [outcome] = runner(service, MemoryClaims(), "node-a").run_once([pending("p", {"1g.10gb": 1})], {})
    assert outcome.outcome == "served" and outcome.results == ()


def test_a_held_pod_whose_instance_another_pod_took_gets_a_new_one(tmp_path):
    """The scheduler gives an instance to any pod asking for its profile: the one made for p1 went
    to a pod nobody claimed, so the next pass makes p1 another one."""
    service, lib = mig_service(tmp_path)
    claims = MemoryClaims()
    run = runner(service, claims, "node-a")
    [served] = run.run_once([pending("p1", {"3g.40gb": 1})], {})
    assert served.outcome == "served"
    (made,) = service.reconciler.snapshot(3).records
    assert lib.mig_node is not None
    lib.mig_node.gpus[3].set_busy(made.computes[0].mig_uuid)  # taken by another pod
    held = pending("p1", {"3g.40gb": 1}, claim=Claim("node-a", NOW))
    [kept] = run.run_once([held], {})
    assert kept.outcome == "kept" and len(kept.results) == 1
    assert sorted(i.profile for i in service.reconciler.current(3)) == ["3g.40gb", "3g.40gb"]
    assert run.run_once([held], {}) == []  # covered now: nothing more changes


def test_a_node_without_mig_enabled_gpus_claims_nothing(tmp_path):
    """Before the layout that enables MIG arrives, the pod is neither claimed nor given up on."""
    service, _ = sim_mig_service(tmp_path)
    claims = MemoryClaims()
    run = runner(service, claims, "node-a")
    assert run.run_once([pending("p", {"3g.40gb": 1})], {}) == []
    assert claims.claims == {} and claims.released == []
    service.apply_declared('{"gpus": {"3": []}}')
    [served] = run.run_once([pending("p", {"3g.40gb": 1})], {})
    assert served.outcome == "served"
