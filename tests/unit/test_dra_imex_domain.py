"""The IMEX domain of DRA claims: the ImexChannelConfig a claim gives its channel request, the
GpuImexDomain's status entries (each agent its own node's), prepare joining and unprepare leaving the
domain, and the node's one IMEX reconciler writing the daemon's node list from the status."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from dradriver.checkpoint import load_checkpoint
from dradriver.claim_cdi import ClaimSpecWriter
from dradriver.devices import dra_devices
from dradriver.imex_domain import (
    DomainNode,
    DomainRef,
    ImexDomainError,
    channel_domain,
    domain_decision,
    joined,
    left,
    only_own_entry_changed,
    parse_config,
    status_patch,
)
from dradriver.imex_domains import NodeImexDomains
from dradriver.prepare import CHECKPOINT_FILE, ClaimError, ClaimPreparer, ClaimRef
from gpuweave.node.imex import DOMAIN_FILE, NODES_CONFIG, ImexConfigWriter, ImexReconciler
from hardware.device_nodes import CharDevice, HostDeviceNodes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend

CHANNEL = "imex-channel-0"
HOST = HostDeviceNodes(control=(CharDevice("/dev/nvidiactl", 195, 255),))
CLIQUE = "6a2b1c3d-0000-4000-8000-000000000001.1"
OTHER = "6a2b1c3d-0000-4000-8000-000000000001.2"
REF = DomainRef("ml", "train")
WANTED = [("gpus", "gpu-0"), ("gpus", "gpu-1"), ("imex", CHANNEL)]


def _config(domain: str = "train", **changes: Any) -> dict[str, Any]:
    return {"apiVersion": "gpuweave.io/v1alpha1", "kind": "ImexChannelConfig", "domain": domain, **changes}


def _claim(*configs: tuple[list[str], Any], driver: str = "gpuweave.io") -> dict[str, Any]:
    entries = [
        {"source": "FromClaim", "requests": requests, "opaque": {"driver": driver, "parameters": parameters}}
        for requests, parameters in configs
    ]
    return {"status": {"allocation": {"devices": {"results": [], "config": entries}}}}


def _node(name: str, clique: str = CLIQUE, address: str = "") -> DomainNode:
    return DomainNode(name=name, address=address or f"10.0.0.{len(name)}", clique=clique)


# ---- the claim's config -------------------------------------------------------------------------


def test_a_config_for_the_channel_request_names_the_domain() -> None:
    assert channel_domain(_claim((["imex"], _config())), wanted=WANTED, channels={CHANNEL}) == "train"
    assert (
        channel_domain(_claim(([], _config())), wanted=WANTED, channels={CHANNEL}) == "train"
    )  # all requests
    sub = [("imex/tray", CHANNEL)]  # a firstAvailable subrequest is named by its request
    assert channel_domain(_claim((["imex"], _config())), wanted=sub, channels={CHANNEL}) == "train"
    later = _claim((["imex"], _config("first")), (["imex"], _config("second")))
    assert channel_domain(later, wanted=WANTED, channels={CHANNEL}) == "second"  # DRA: the last wins


def test_no_config_or_another_drivers_config_names_no_domain() -> None:
    assert channel_domain({"status": {"allocation": {}}}, wanted=WANTED, channels={CHANNEL}) is None
    other = _claim((["imex"], {"anything": True}), driver="gpu.nvidia.com")
    assert channel_domain(other, wanted=WANTED, channels={CHANNEL}) is None
    no_channel = [("gpus", "gpu-0")]  # the claim's channel is on another node
    assert channel_domain(_claim(([], _config())), wanted=no_channel, channels={CHANNEL}) is None


@pytest.mark.parametrize(
    ("parameters", "where"),
    [
        (_config(kind="ComputeDomainChannelConfig"), "at kind"),
        (_config(apiVersion="gpuweave.io/v1"), "at apiVersion"),
        (_config("Not_A_Name"), "at domain"),
        (_config("x" * 254), "at domain"),
        (_config(extra=1), "at extra"),
        ({"apiVersion": "gpuweave.io/v1alpha1", "kind": "ImexChannelConfig"}, "at domain"),
        ("train", "at parameters"),
    ],
)
def test_bad_parameters_are_one_clear_error(parameters: Any, where: str) -> None:
    with pytest.raises(ImexDomainError) as caught:
        channel_domain(_claim((["imex"], parameters)), wanted=WANTED, channels={CHANNEL})
    message = str(caught.value)
    assert message.startswith("allocation config[0]: opaque parameters of driver gpuweave.io are not an ")
    assert where in message and len(message) < 700


def test_a_channel_config_on_a_gpu_request_is_refused() -> None:
    with pytest.raises(ImexDomainError, match="names request gpus, which holds no IMEX channel"):
        channel_domain(_claim((["gpus"], _config())), wanted=WANTED, channels={CHANNEL})


def test_parse_config_reads_the_documented_form() -> None:
    config = parse_config(_config(), where="x")
    assert (config.api_version, config.kind, config.domain) == (
        "gpuweave.io/v1alpha1",
        "ImexChannelConfig",
        "train",
    )


# ---- the status entries -------------------------------------------------------------------------


def test_joining_is_idempotent_sorted_and_bounded() -> None:
    b0 = _node("b0")
    entries = joined((), b0, num_nodes=2)
    assert entries == (b0,) and joined(entries, b0, num_nodes=2) == entries
    both = joined(entries, _node("a0"), num_nodes=2)
    assert [e.name for e in both] == ["a0", "b0"]
    moved = joined(both, _node("b0", address="10.9.9.9"), num_nodes=2)  # the node's own entry replaced
    assert [e.address for e in moved] == [both[0].address, "10.9.9.9"]
    with pytest.raises(ImexDomainError, match=r"already lists 2 node\(s\).*spec.numNodes is 2"):
        joined(both, _node("c0"), num_nodes=2)


def test_leaving_removes_only_the_nodes_entry() -> None:
    entries = (_node("a0"), _node("b0"), _node("c0"))
    assert left(entries, "b0") == (entries[0], entries[2])
    assert left(entries, "zz") == entries


def test_an_agent_may_change_only_its_own_entry() -> None:
    entries = (_node("a0"), _node("b0"))
    assert only_own_entry_changed(entries, left(entries, "a0"), node="a0")
    assert only_own_entry_changed(entries, joined(entries, _node("c0"), num_nodes=3), node="c0")
    assert not only_own_entry_changed(entries, left(entries, "b0"), node="a0")
    assert not only_own_entry_changed(entries, (entries[0], _node("b0", address="1.2.3.4")), node="a0")


def test_the_status_patch_is_preconditioned_on_the_version_read() -> None:
    patch = status_patch((_node("a0", address="10.0.0.1"),), resource_version="42")
    assert patch == {
        "metadata": {"resourceVersion": "42"},
        "status": {"nodes": [{"name": "a0", "address": "10.0.0.1", "clique": CLIQUE}]},
    }


def _domain(*entries: DomainNode, num_nodes: int = 4) -> dict[str, Any]:
    return {"spec": {"numNodes": num_nodes}, "status": {"nodes": [e.to_wire() for e in entries]}}


def test_the_daemon_serves_the_entries_of_its_own_clique() -> None:
    obj = _domain(_node("a0"), _node("a1"), _node("b0", clique=OTHER))
    decision = domain_decision(obj, ref=REF, holder="ml/c", node="a0", clique=CLIQUE)
    assert decision.domain is not None and decision.domain.nodes == ("a0", "a1")
    assert decision.domain.name.startswith("ml-train-") and decision.holder == "ml/c"
    assert "left out b0 (registered in another clique" in decision.problem


def test_no_domain_when_it_is_gone_broken_or_does_not_list_the_node() -> None:
    gone = domain_decision(None, ref=REF, holder="ml/c", node="a0", clique=CLIQUE)
    assert gone.domain is None and "GpuImexDomain ml/train of claim ml/c is gone" in gone.problem
    other = domain_decision(_domain(_node("a1")), ref=REF, holder="ml/c", node="a0", clique=CLIQUE)
    assert other.domain is None and "does not list node a0" in other.problem
    broken = domain_decision({"spec": {"numNodes": 0}}, ref=REF, holder="ml/c", node="a0", clique=CLIQUE)
    assert broken.domain is None and "at numNodes" in broken.problem


# ---- prepare joins, unprepare leaves ------------------------------------------------------------


@dataclass
class FakeDomains:
    """``DomainApi`` over in-memory objects, with the kube adapter's rules (``_edit``)."""

    objects: dict[DomainRef, dict[str, Any]] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=lambda: {"n0": "10.0.0.10"})
    watchers: dict[DomainRef, list[Callable[[Mapping[str, Any] | None], None]]] = field(default_factory=dict)
    writes: int = 0

    def address(self, node: str) -> str:
        return self.addresses.get(node, "")

    def _edit(
        self, ref: DomainRef, change: Callable[[tuple[DomainNode, ...], int], tuple[DomainNode, ...]]
    ) -> None:
        obj = self.objects[ref]
        entries = tuple(DomainNode(**e) for e in obj.get("status", {}).get("nodes", []))
        wanted = change(entries, obj["spec"]["numNodes"])
        if wanted != entries:
            self.writes += 1
            obj["status"] = {"nodes": [e.to_wire() for e in wanted]}
            for notify in self.watchers.get(ref, []):
                notify(obj)

    def join(self, ref: DomainRef, entry: DomainNode) -> None:
        if ref not in self.objects:
            raise ImexDomainError(f"{ref.describe()} not found")
        self._edit(ref, lambda entries, num: joined(entries, entry, num_nodes=num))

    def leave(self, ref: DomainRef, node: str) -> None:
        if ref in self.objects:
            self._edit(ref, lambda entries, _num: left(entries, node))

    def watch(
        self, ref: DomainRef, on_object: Callable[[Mapping[str, Any] | None], None]
    ) -> Callable[[], None]:
        self.watchers.setdefault(ref, []).append(on_object)
        on_object(self.objects.get(ref))
        return lambda: self.watchers[ref].remove(on_object)

    def nodes(self, ref: DomainRef) -> list[str]:
        return [e["name"] for e in self.objects[ref].get("status", {}).get("nodes", [])]


_TRAY: list[NodeInventory] = []


def tray() -> NodeInventory:
    if not _TRAY:
        backend = SimulatedBackend(load_profile("gb200-compute-tray"), node_name="n0")
        try:
            _TRAY.append(backend.discover())
        finally:
            backend.close()
    return _TRAY[0]


@dataclass
class Claims:
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, uid: str, name: str, *configs: tuple[list[str], Any]) -> ClaimRef:
        results = [
            {"request": r, "driver": "gpuweave.io", "pool": "n0", "device": d}
            for r, d in (("gpus", "gpu-0"), ("imex", CHANNEL))
        ]
        claim = _claim(*configs)
        claim["metadata"] = {"uid": uid, "namespace": "ml", "name": name}
        claim["status"]["allocation"]["devices"]["results"] = results
        self.claims[name] = claim
        return ClaimRef(uid, "ml", name)

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[name]


@dataclass
class Node:
    state: Path
    api: FakeDomains
    claims: Claims = field(default_factory=Claims)
    clique: str | None = CLIQUE

    def start(self) -> tuple[ClaimPreparer, NodeImexDomains]:
        domains = NodeImexDomains(node="n0", api=self.api, clique=lambda: self.clique)
        preparer = ClaimPreparer(
            pool="n0",
            state_dir=self.state,
            source=self.claims,
            devices=lambda: (tray(), dra_devices(tray())),
            specs=ClaimSpecWriter(self.state / "cdi"),
            host=lambda: HOST,
            imex=domains,
        )
        return preparer, domains


@pytest.fixture
def node(tmp_path: Path) -> Node:
    api = FakeDomains()
    api.objects[REF] = _domain(_node("n1"), num_nodes=3)
    return Node(tmp_path, api)


def test_prepare_joins_the_domain_and_unprepare_leaves_it(node: Node) -> None:
    preparer, domains = node.start()
    ref = node.claims.add("u1", "c1", (["imex"], _config()))
    assert [p.device_name for p in preparer.prepare(ref)] == ["gpu-0", CHANNEL]
    assert node.api.nodes(REF) == ["n0", "n1"]
    assert node.api.objects[REF]["status"]["nodes"][0] == {
        "name": "n0",
        "address": "10.0.0.10",
        "clique": CLIQUE,
    }
    assert load_checkpoint(node.state / CHECKPOINT_FILE)["u1"]["imex"] == {"namespace": "ml", "name": "train"}
    decision = domains.decide(node="n0", clique=CLIQUE)
    assert (
        decision.domain is not None and decision.domain.nodes == ("n0", "n1") and decision.holder == "ml/c1"
    )
    preparer.prepare(ref)  # prepared already: no second write
    assert node.api.writes == 1
    preparer.unprepare(ref)
    assert node.api.nodes(REF) == ["n1"] and domains.held is None
    assert domains.decide(node="n0", clique=CLIQUE).domain is None


def test_a_claim_without_config_joins_nothing(node: Node) -> None:
    preparer, domains = node.start()
    preparer.prepare(node.claims.add("u1", "c1"))
    assert node.api.writes == 0 and domains.held is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            (["imex"], _config(kind="Other")),
            "opaque parameters of driver gpuweave.io are not an ImexChannelConfig",
        ),
        (
            (["imex"], _config("missing")),
            "cannot join GpuImexDomain ml/missing: GpuImexDomain ml/missing not found",
        ),
    ],
)
def test_a_claim_that_cannot_join_is_not_prepared(
    node: Node, config: tuple[list[str], Any], message: str
) -> None:
    preparer, domains = node.start()
    with pytest.raises(ClaimError, match=message):
        preparer.prepare(node.claims.add("u1", "c1", config))
    assert preparer.prepared() == {} and load_checkpoint(node.state / CHECKPOINT_FILE) == {}
    assert not list((node.state / "cdi").glob("*.json")) and domains.held is None


def test_a_node_without_an_address_or_a_full_domain_is_refused(node: Node) -> None:
    preparer, _ = node.start()
    node.api.addresses.clear()
    with pytest.raises(ClaimError, match="node n0 has no InternalIP"):
        preparer.prepare(node.claims.add("u1", "c1", (["imex"], _config())))
    node.api.addresses["n0"] = "10.0.0.10"
    node.api.objects[REF] = _domain(_node("n1"), _node("n2"), num_nodes=2)
    with pytest.raises(ClaimError, match=r"spec\.numNodes is 2: node n0 cannot join"):
        preparer.prepare(node.claims.add("u2", "c2", (["imex"], _config())))


def test_one_domain_at_a_time(node: Node) -> None:
    preparer, _ = node.start()
    preparer.prepare(node.claims.add("u1", "c1", (["imex"], _config())))
    with pytest.raises(ClaimError, match="held by claim ml/c1 in GpuImexDomain ml/train"):
        preparer.prepare(node.claims.add("u2", "c2", (["imex"], _config())))
    assert node.api.nodes(REF) == ["n0", "n1"]  # the refused claim did not take the first one's entry away


def test_a_restart_follows_the_domain_again_without_writing(node: Node) -> None:
    preparer, _ = node.start()
    ref = node.claims.add("u1", "c1", (["imex"], _config()))
    preparer.prepare(ref)
    again, domains = node.start()
    assert node.api.writes == 1
    held = domains.held
    assert held is not None and (held.uid, held.ref) == ("u1", REF)
    again.unprepare(ref)
    assert node.api.nodes(REF) == ["n1"]


def test_a_join_cut_short_by_a_crash_is_undone_at_the_next_start(node: Node) -> None:
    node.api.join(REF, DomainNode(name="n0", address="10.0.0.10", clique=CLIQUE))  # written, then the crash
    pending = {"namespace": "ml", "name": "c1", "pending": True, "mig": [], "imex": REF.to_wire()}
    (node.state / CHECKPOINT_FILE).write_text(json.dumps({"version": 1, "claims": {"u1": pending}}))
    _, domains = node.start()
    assert node.api.nodes(REF) == ["n1"] and domains.held is None
    assert load_checkpoint(node.state / CHECKPOINT_FILE) == {}


def test_an_unprepare_that_cannot_leave_is_retried(node: Node) -> None:
    preparer, _ = node.start()
    ref = node.claims.add("u1", "c1", (["imex"], _config()))
    preparer.prepare(ref)

    def refuse(_ref: DomainRef, _node: str) -> None:
        raise GpuweaveError("API server unreachable")

    node.api.leave = refuse  # type: ignore[method-assign]
    with pytest.raises(ClaimError, match="cannot remove this node from GpuImexDomain ml/train"):
        preparer.unprepare(ref)
    assert "u1" in preparer.prepared()  # still prepared: the kubelet calls again


# ---- the node's one reconciler over the domain ----------------------------------------------------


def test_the_reconciler_writes_the_cliques_entries_and_tears_them_down(node: Node, tmp_path: Path) -> None:
    node.api.objects[REF] = _domain(_node("n1"), _node("x1", clique=OTHER), num_nodes=4)
    preparer, domains = node.start()
    writer = ImexConfigWriter(tmp_path / "imex", simulated=True)
    peers = {"n0": "10.0.0.10", "n1": "10.0.0.11"}  # the Nodes labelled with the clique
    reconciler = ImexReconciler(
        domains, node="n0", clique=lambda: CLIQUE, peers=lambda _c: peers, writer=writer
    )
    assert reconciler.reconcile() is None
    ref = node.claims.add("u1", "c1", (["imex"], _config()))
    preparer.prepare(ref)
    config = reconciler.reconcile()
    assert config is not None and config.nodes == ("n0", "n1")
    assert (tmp_path / "imex" / NODES_CONFIG).read_text() == "10.0.0.10\n10.0.0.11\n"
    record = writer.current()
    assert record is not None and record["holder"] == "ml/c1" and record["domain"] == REF.domain_name()
    assert "left out x1" in reconciler.problem
    preparer.unprepare(ref)
    assert reconciler.reconcile() is None
    assert not (tmp_path / "imex" / NODES_CONFIG).exists() and not (tmp_path / "imex" / DOMAIN_FILE).exists()
