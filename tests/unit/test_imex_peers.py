"""What may reach the IMEX daemon's peer list: a peer's address comes from its Node's InternalIP,
which is input (whoever may write that Node's status sets it), so ``nodes_config.cfg`` takes exactly
one IP address per peer, each once, and at most the largest NVLink domain's nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from devicemodel.assignment import MAX_IMEX_NODES, ImexDomain, PodAssignment
from deviceplugin.handoff import PodView
from gpuweave.node.imex import NODES_CONFIG, ImexConfigWriter, ImexMetrics, ImexReconciler
from nodeagent.imex import MAX_ADDRESS_CHARS, LeftOut, imex_config, peer_address

CLIQUE = "6a2b1c3d-0000-4000-8000-00000000aaaa.1"
HOSTILE = {
    "newline": "10.0.0.3\n10.0.0.66",
    "path": "/etc/nvidia-imex/config.cfg",
    "hostname": "imex.attacker.example",
    "huge": "1" * 100_000,
    "scoped": "fe80::1%eth0\n10.0.0.66",  # ipaddress takes any scope text, a newline too
    "padded": " 10.0.0.3",
    "unspecified": "0.0.0.0",
}


@pytest.mark.parametrize("raw", [*HOSTILE.values(), "", "10.0.0.1/24", "010.0.0.1", "10.0.0"])
def test_anything_but_one_ip_address_is_no_peer_address(raw: str) -> None:
    assert peer_address(raw) is None


def test_an_ip_address_is_written_in_its_canonical_form() -> None:
    assert peer_address("10.0.0.1") == "10.0.0.1"
    assert peer_address("FD00::0001") == "fd00::1"
    assert peer_address("::ffff:10.0.0.1") == "::ffff:a00:1"
    assert len("0000:0000:0000:0000:0000:ffff:255.255.255.255") == MAX_ADDRESS_CHARS
    assert peer_address("0000:0000:0000:0000:0000:ffff:255.255.255.255") == "::ffff:ffff:ffff"


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_peer_with_a_hostile_address_is_left_out_and_reported(kind: str) -> None:
    domain = ImexDomain(name="d", nodes=("a0", "a1", "a2"))
    peers = {"a0": "10.0.0.1", "a1": HOSTILE[kind], "a2": "10.0.0.2"}
    plan = imex_config(domain, node="a0", clique=CLIQUE, peers=peers)
    assert plan.config is not None and plan.config.nodes_config() == "10.0.0.1\n10.0.0.2\n"
    assert plan.config.nodes == ("a0", "a2")
    assert plan.left_out == (("a1", LeftOut.NOT_AN_ADDRESS),)
    assert plan.counts()[LeftOut.NOT_AN_ADDRESS] == 1
    assert "left out a1" in plan.problem and "not one IP address" in plan.problem
    assert "\n" not in plan.problem and len(plan.problem) < 400  # quoted and clipped for the log


def test_a_repeated_address_and_peers_past_the_largest_domain_are_left_out() -> None:
    nodes = tuple(f"n{i}" for i in range(MAX_IMEX_NODES))
    peers = {name: f"10.{i // 256}.{i % 256}.1" for i, name in enumerate(nodes)}
    peers["n1"] = peers["n0"]
    plan = imex_config(ImexDomain(name="d", nodes=nodes), node="n0", clique=CLIQUE, peers=peers)
    assert plan.config is not None and len(plan.config.addresses) == MAX_IMEX_NODES - 1
    assert plan.left_out == (("n1", LeftOut.DUPLICATE),)
    assert plan.config.nodes_config().count("\n") == MAX_IMEX_NODES - 1
    # the domain's model caps its nodes already; the writer holds the line by itself as well
    wide = ImexDomain.model_construct(name="d", nodes=(*nodes, "n-extra"))
    peers |= {"n1": "10.9.9.9", "n-extra": "10.9.9.8"}
    plan = imex_config(wide, node="n0", clique=CLIQUE, peers=peers)
    assert plan.config is not None and len(plan.config.addresses) == MAX_IMEX_NODES
    assert plan.left_out == (("n-extra", LeftOut.OVER_CAP),)


def test_the_node_with_a_hostile_address_of_its_own_configures_nothing() -> None:
    domain = ImexDomain(name="d", nodes=("a0", "a1"))
    plan = imex_config(domain, node="a0", clique=CLIQUE, peers={"a0": HOSTILE["newline"], "a1": "10.0.0.2"})
    assert plan.config is None and "left out of its own IMEX domain d" in plan.problem


def test_the_reconciler_writes_only_addresses_and_counts_what_it_left_out(tmp_path: Path) -> None:
    view = PodView()
    registry = CollectorRegistry()
    nodes = ("a0", *sorted(HOSTILE), "a9")
    peers = {"a0": "10.0.0.1", "a9": "10.0.0.9", **HOSTILE}
    reconciler = ImexReconciler(
        view,
        node="a0",
        clique=lambda: CLIQUE,
        peers=lambda clique: peers,
        writer=ImexConfigWriter(tmp_path, simulated=True),
        metrics=ImexMetrics(registry),
    )
    assignment = PodAssignment(node="a0", containers={}, imex=ImexDomain(name="d", nodes=nodes))
    view.upsert(
        uid="u", namespace="ml", name="holder", phase="Running",
        annotation=assignment.to_annotation(), requests_imex=True,
    )  # fmt: skip
    config = reconciler.reconcile()
    assert config is not None and config.nodes == ("a0", "a9")
    assert (tmp_path / NODES_CONFIG).read_text() == "10.0.0.1\n10.0.0.9\n"
    assert reconciler.left_out[LeftOut.NOT_AN_ADDRESS] == len(HOSTILE)
    sample = registry.get_sample_value
    assert sample("gpuweave_imex_peers_left_out", {"reason": "not-an-address"}) == len(HOSTILE)
    assert sample("gpuweave_imex_peers_left_out", {"reason": "duplicate-address"}) == 0
    assert "left out" in reconciler.problem and "\n" not in reconciler.problem
