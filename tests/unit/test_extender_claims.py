"""Claim-aware scores (``prioritize-claims``): NVLink-connected sets and aligned EFA rank first."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dradriver.slices import pool_slices
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from scheduler_ext.app import build_core
from scheduler_ext.cluster.claims import (
    MAX_COUNT,
    MAX_REQUESTS,
    ClaimBook,
    Demand,
    SliceDevice,
    claim_demand,
    parse_slice,
    score_node,
    summarize,
)
from scheduler_ext.kube import dra_kinds
from tests.support.pods import pod_body

REPO = Path(__file__).parents[2]


def _attrs(kind: str, domain: str = "", root: str = "") -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": kind}}
    if domain:
        attributes["nvlinkDomain"] = {"string": domain}
    if root:
        attributes["resource.kubernetes.io/pcieRoot"] = {"string": root}
    return attributes


def _slice(
    node: str,
    gpus: list[tuple[str, str, str]],
    efas: list[tuple[str, str]] = (),  # type: ignore[assignment]
    *,
    generation: int = 1,
    taint: str = "",
) -> dict[str, Any]:
    devices = [{"name": n, "attributes": _attrs("gpu", d, r)} for n, d, r in gpus]
    devices += [{"name": n, "attributes": _attrs("efa", root=r)} for n, r in efas]
    for device in devices:
        if device["name"] == taint:
            device["taints"] = [{"key": "gpuweave.io/unhealthy", "value": "failed", "effect": "NoExecute"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpuweave.io-0"},
        "spec": {
            "driver": "gpuweave.io",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim(
    name: str,
    requests: list[dict[str, Any]],
    constraints: list[dict[str, Any]] = (),  # type: ignore[assignment]
    *,
    results: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests, "constraints": list(constraints)}},
    }
    if results:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": "gpuweave.io", "pool": p, "device": d}
                        for p, d in results
                    ]
                }
            }
        }
    return claim


def _gpus(count: int, name: str = "gpus") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.gpuweave.io", "count": count}}


def _efa(count: int = 1) -> dict[str, Any]:
    return {"name": "efa", "exactly": {"deviceClassName": "efa.gpuweave.io", "count": count}}


def _pod(*claims: str, template: dict[str, str] | None = None) -> dict[str, Any]:
    pod = pod_body("p", namespace="default", uid="pod-uid", claims={c: c for c in claims})
    refs: list[dict[str, str]] = pod["spec"].setdefault("resourceClaims", [])
    if template:
        for ref, claim in template.items():
            refs.append({"name": ref, "resourceClaimTemplateName": "t"})
            pod.setdefault("status", {}).setdefault("resourceClaimStatuses", []).append(
                {"name": ref, "resourceClaimName": claim}
            )
    return pod


ROOT = "resource.kubernetes.io/pcieRoot"
TWO_DOMAINS = [(f"gpu-{i}", "nvl0" if i < 4 else "nvl1", f"pci{i // 2}") for i in range(8)]


@pytest.fixture
def book() -> ClaimBook:
    book = ClaimBook()
    # whole: 4 free GPUs in nvl0; split: 2 free in nvl0 and 2 in nvl1 (others allocated)
    book.upsert_slice(_slice("whole", TWO_DOMAINS))
    book.upsert_slice(_slice("split", TWO_DOMAINS))
    book.upsert_claim(_claim("busy-whole", [_gpus(4)], results=[("whole", f"gpu-{i}") for i in range(4, 8)]))
    book.upsert_claim(
        _claim("busy-split", [_gpus(4)], results=[("split", d) for d in ("gpu-0", "gpu-1", "gpu-4", "gpu-5")])
    )
    return book


def test_nvlink_connected_node_ranks_above_one_with_free_gpus_split_across_domains(book: ClaimBook) -> None:
    book.upsert_claim(_claim("want", [_gpus(4)]))
    whole, split, other = book.scores(_pod("want"), ["whole", "split", "no-dra-node"])
    assert whole > split > 0
    assert other == 0


def test_a_required_nvlink_constraint_scores_the_split_node_zero(book: ClaimBook) -> None:
    constraint = {"requests": ["gpus"], "matchAttribute": "gpuweave.io/nvlinkDomain"}
    book.upsert_claim(_claim("want", [_gpus(4)], [constraint]))
    assert book.scores(_pod("want"), ["whole", "split"])[1] == 0


def test_aligned_efa_ranks_higher() -> None:
    book = ClaimBook()
    gpus = [("gpu-0", "nvl0", "pciA"), ("gpu-1", "nvl0", "pciB")]
    book.upsert_slice(_slice("aligned", gpus, [("efa-0", "pciA")]))
    book.upsert_slice(_slice("apart", gpus, [("efa-0", "pciC")]))
    book.upsert_claim(_claim("want", [_gpus(1, "gpu"), _efa()]))
    aligned, apart = book.scores(_pod("want"), ["aligned", "apart"])
    assert aligned > apart > 0
    # with the pcieRoot constraint the allocator cannot meet the claim on "apart" at all
    book.upsert_claim(
        _claim("strict", [_gpus(1, "gpu"), _efa()], [{"requests": ["gpu", "efa"], "matchAttribute": ROOT}])
    )
    assert book.scores(_pod("strict"), ["aligned", "apart"]) == [aligned, 0]


def test_exact_fit_domain_is_preferred_over_a_larger_one() -> None:
    full = summarize([], frozenset())
    assert score_node(full, Demand(gpus=1)) == 0
    book = ClaimBook()
    book.upsert_slice(_slice("four", TWO_DOMAINS[:4]))
    book.upsert_slice(_slice("eight", [(n, "nvl0", r) for n, _, r in TWO_DOMAINS]))
    book.upsert_claim(_claim("want", [_gpus(4)]))
    four, eight = book.scores(_pod("want"), ["four", "eight"])
    assert four > eight > 0


def test_pod_without_claims_scores_zero_everywhere(book: ClaimBook) -> None:
    pod = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c"}]}}
    assert book.scores(pod, ["whole", "split"]) == [0, 0]
    book.upsert_claim(
        _claim("other-driver", [{"name": "x", "exactly": {"deviceClassName": "gpu.nvidia.com"}}])
    )
    assert book.scores(_pod("other-driver"), ["whole", "split"]) == [0, 0]
    assert book.scores(_pod("unknown-claim"), ["whole", "split"]) == [0, 0]


def test_claim_from_a_template_is_found_through_the_pod_status(book: ClaimBook) -> None:
    book.upsert_claim(_claim("p-gpus-abcde", [_gpus(4)]))
    pod = _pod(template={"gpus": "p-gpus-abcde"})
    whole, split = book.scores(pod, ["whole", "split"])
    assert whole > split


def test_allocation_changes_and_deletes_move_the_scores(book: ClaimBook) -> None:
    book.upsert_claim(_claim("want", [_gpus(4)]))
    before = book.scores(_pod("want"), ["whole"])
    book.upsert_claim(_claim("more", [_gpus(1)], results=[("whole", "gpu-0")]))
    assert book.scores(_pod("want"), ["whole"])[0] < before[0]
    book.delete_claim({"metadata": {"name": "more", "namespace": "default"}})
    assert book.scores(_pod("want"), ["whole"]) == before
    book.delete_slice({"metadata": {"name": "whole-gpuweave.io-0"}})
    assert book.scores(_pod("want"), ["whole"]) == [0]


def test_tainted_devices_and_old_generations_are_not_free() -> None:
    book = ClaimBook()
    book.upsert_slice(_slice("n", TWO_DOMAINS[:4], taint="gpu-0"))
    book.upsert_claim(_claim("want", [_gpus(4)]))
    assert book.scores(_pod("want"), ["n"]) == [0]  # three untainted GPUs for four
    old = _slice("n", TWO_DOMAINS, generation=1)
    old["metadata"]["name"] = "n-gpuweave.io-old"
    book.upsert_slice(_slice("n", TWO_DOMAINS[:4], generation=2))
    book.upsert_slice(old)
    summary = book.summary("n")
    assert summary is not None and sum(c for d in summary.domains for _, c in d) == 4


def test_an_allocated_claim_of_the_pod_asks_nothing_more(book: ClaimBook) -> None:
    book.upsert_claim(_claim("done", [_gpus(4)], results=[("whole", "gpu-0")]))
    assert book.scores(_pod("done"), ["whole", "split"]) == [0, 0]


def test_hostile_claims_cost_bounded_work_and_score_zero(
    book: ClaimBook, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="scheduler_ext.cluster.claims"):
        book.upsert_claim(_claim("many", [_gpus(1, f"r{i}") for i in range(MAX_REQUESTS + 1)]))
        book.upsert_claim(_claim("huge", [_gpus(MAX_COUNT + 1)]))
    assert "not scored" in caplog.text
    for name in ("many", "huge"):
        assert book.scores(_pod(name), ["whole", "split"]) == [0, 0]
    for bad in (
        {"spec": {"devices": "x"}},
        {"spec": {"devices": {"requests": [{"exactly": {"count": "lots"}}]}}},
        {
            "spec": {
                "devices": {
                    "requests": [{"exactly": {"deviceClassName": "gpu.gpuweave.io", "allocationMode": "All"}}]
                }
            }
        },
        {"spec": {"devices": {"requests": 5}}},
    ):
        demand, problem = claim_demand(bad)
        assert demand is None and problem
    assert parse_slice({"spec": {"driver": "gpuweave.io", "nodeName": "n", "devices": [{}] * 2000}}) is None
    assert parse_slice({"spec": {"driver": "other", "nodeName": "n"}}) is None
    pod = _pod(*[f"c{i}" for i in range(100)])
    assert book.scores(pod, ["whole"]) == [0]


def _p5_book() -> ClaimBook:
    backend = SimulatedBackend(load_profile("p5.48xlarge"), node_name="p5")
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    book = ClaimBook()
    for obj in pool_slices(inventory):
        book.upsert_slice(obj)
    return book


def test_the_agents_own_slices_parse_with_their_domains_and_roots() -> None:
    book = _p5_book()
    summary = book.summary("p5")
    assert summary is not None
    assert len(summary.domains) == 1 and sum(n for _, n in summary.domains[0]) == 8  # one NVSwitch domain
    assert sum(n for _, n in summary.efa) == 32
    roots = {r for r, _ in summary.domains[0]}
    assert roots and roots <= {r for r, _ in summary.efa}  # every GPU's root has EFA adapters
    book.upsert_claim(
        _claim("want", [_gpus(1, "gpu"), _efa(2)], [{"requests": ["gpu", "efa"], "matchAttribute": ROOT}])
    )
    assert book.scores(_pod("want"), ["p5"])[0] >= 9


def test_the_shipped_topology_example_scores_high_on_p5_and_one_root_for_two_gpus_zero() -> None:
    """manifests/dra/example-claims-topology.yaml: each GPU with an adapter on its own root, the
    pair in one NVLink domain, is met on a p5.48xlarge; one root for both GPUs is not (every H100
    has its own root there), which the allocator would refuse too."""
    template = yaml.safe_load((REPO / "manifests" / "dra" / "example-claims-topology.yaml").read_text())
    demand, problem = claim_demand({"spec": template["spec"]["spec"]})
    assert demand == Demand(gpus=2, efas=2, nvlink_groups=(2,), root_groups=((1, 1), (1, 1))), problem
    book = _p5_book()
    assert score_node(book.summary("p5"), demand) == 9  # type: ignore[arg-type]  # 8 in the domain: no exact fit
    one_root = Demand(gpus=2, efas=2, nvlink_groups=(2,), root_groups=((2, 2),))
    assert score_node(book.summary("p5"), one_root) == 0  # type: ignore[arg-type]


def test_an_nvlink_group_that_fits_no_domain_scores_zero_but_a_loose_split_scores_two() -> None:
    summary = summarize(
        [SliceDevice(f"gpu-{i}", "gpu", f"nvl{i // 2}", f"r{i}", False) for i in range(4)], frozenset()
    )
    assert score_node(summary, Demand(gpus=4, nvlink_groups=(4,))) == 0
    assert score_node(summary, Demand(gpus=4, nvlink_groups=(2, 2))) == 2
    assert score_node(summary, Demand(gpus=4)) == 2
    assert score_node(summary, Demand(gpus=2, nvlink_groups=(2,))) == 10


def test_dra_watches_are_skipped_when_the_api_does_not_serve_or_allow_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An older cluster (no resource.k8s.io/v1) or an identity without the RBAC: no watch that
    would retry forever and hold readiness back; claim pods then score 0."""
    cache, _ = build_core()
    calls: list[str] = []

    def refuse(self: object, group: str, version: str, plural: str, **kwargs: object) -> object:
        calls.append(f"{group}/{version}/{plural}")
        raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(client.CustomObjectsApi, "list_cluster_custom_object", refuse)
    assert dra_kinds(cache, client.ApiClient()) == ()
    assert calls == ["resource.k8s.io/v1/resourceslices"]

    class Served:
        data = b"{}"

    monkeypatch.setattr(client.CustomObjectsApi, "list_cluster_custom_object", lambda *a, **k: Served())
    kinds = dra_kinds(cache, client.ApiClient())
    assert [k.name for k in kinds] == ["resourceslices", "resourceclaims"]
    slices, claims = kinds
    slices.apply("ADDED", _slice("n", TWO_DOMAINS))
    claims.apply("ADDED", _claim("want", [_gpus(4)]))
    assert cache.claims.scores(_pod("want"), ["n"])[0] > 0
    slices.apply("DELETED", {"metadata": {"name": "n-gpuweave.io-0"}})
    assert cache.claims.scores(_pod("want"), ["n"]) == [0]
