"""`gpuweave status --explain`: reasons counted across nodes, what would make a pod fit, and a
placed pod's devices, topology score and runners-up, all from the extender's own decisions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devicemodel.contracts import ANNOTATION_GPU_SELECTOR, RESOURCE_GPU
from devicemodel.errors import InvalidInputError
from devicemodel.inventory import NodeInventory
from devicemodel.text import MAX_JSON_CHARS
from gpuweave.cli import main
from gpuweave.simulate.cluster_objects import node_object, pod_object, profile_inventory
from gpuweave.status.explain import Pending, Placed, explain
from gpuweave.status.text import WIDTH, explain_text, to_json
from nodeagent.published import inventory_object
from scheduler_ext.decide.summary import reason_counts, rejection_message
from tests.unit.test_status_rows import bound
from topology.graph import TopologyGraph
from topology.scoring import score_set

TAINT = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}


def tainted(name: str) -> dict[str, Any]:
    node = node_object(name, gpus=8)
    node["spec"]["taints"] = [TAINT]
    return node


def held(
    name: str, node: str, inventory: NodeInventory, gpus: list[int], *, priority: int = 0
) -> dict[str, Any]:
    pod = bound(name, node, {RESOURCE_GPU: [inventory.gpus[i].uuid for i in gpus]})
    pod["spec"]["priority"] = priority
    return pod


@pytest.fixture
def inventories() -> dict[str, NodeInventory]:
    return {
        "gpu-v100": profile_inventory("dgx1-v100", "gpu-v100"),
        "gpu-l40s": profile_inventory("l40s-pcie-8", "gpu-l40s"),
        "gpu-h100": profile_inventory("dgx-h100", "gpu-h100"),
    }


def cluster(inventories: dict[str, NodeInventory], *, h100_withheld: bool = False) -> list[dict[str, Any]]:
    v100, l40s, h100 = inventories["gpu-v100"], inventories["gpu-l40s"], inventories["gpu-h100"]
    withheld = {h100.gpus[3].uuid: "Xid 79 (suspect)"} if h100_withheld else {}
    return [
        inventory_object(v100), inventory_object(l40s), inventory_object(h100, withheld=withheld),
        node_object("gpu-v100", gpus=8), node_object("gpu-l40s", gpus=8), tainted("gpu-h100"),
        held("quad", "gpu-v100", v100, [0, 1, 2, 3]),
        held("pair", "gpu-l40s", l40s, [0, 1], priority=20),
        held("four", "gpu-l40s", l40s, [4, 5, 6, 7]),
        pod_object("eight", namespace="train", limits={RESOURCE_GPU: 8}, priority=10),
        pod_object("nine", namespace="train", limits={RESOURCE_GPU: 9}),
        pod_object("web", namespace="train"),
    ]


def test_reasons_are_counted_across_nodes_in_kube_schedulers_form() -> None:
    counts = reason_counts([
        ("a", "pod needs 8 free GPUs; node has 4 free of 8"),
        ("b", "pod needs 8 free GPUs; node has 4 free of 8"),
        ("c", "node c publishes no GpuNodeInventory; run the agent"),
        ("d", "node d publishes no GpuNodeInventory; run the agent"),
        ("e", "pod needs 8 free GPUs; node has 2 free of 8"),
    ])
    assert counts == [
        ("pod needs 8 free GPUs; node has 4 free of 8", 2),
        ("the node publishes no GpuNodeInventory; run the agent", 2),
        ("pod needs 8 free GPUs; node has 2 free of 8", 1),
    ]
    assert rejection_message(5, counts[:1]) == (
        "0/5 nodes are available: 2 node(s): pod needs 8 free GPUs; node has 4 free of 8."
    )


def test_pending_pod_gets_counted_reasons_and_the_nearest_node(inventories: Any) -> None:
    answer = explain(cluster(inventories), "train/eight")
    assert isinstance(answer, Pending)
    assert answer.total == 3 and answer.available == ()
    assert dict(answer.reasons) == {
        "node(s) had untolerated taint {dedicated: infra}": 1,
        "pod needs 8 free GPUs; node has 4 free of 8": 1,
        "pod needs 8 free GPUs; node has 2 free of 8": 1,
    }
    # v100 needs one pod gone (quad, priority 0 < 10); l40s would need two
    assert answer.hints[0] == "fits node gpu-v100 once 1 pod(s) there end or are preempted: train/quad"
    # the tainted H100 is empty: it would fit, if kube-scheduler let the pod there
    assert answer.hints[1].startswith(
        "1 node(s) kube-scheduler filters out would fit: gpu-h100 (node(s) had untolerated taint"
    )


def test_withheld_devices_and_size_are_named_when_nothing_can_be_freed(inventories: Any) -> None:
    others = ("gpu-v100", "gpu-l40s")
    objects = [
        o for o in cluster(inventories, h100_withheld=True)
        if o["metadata"]["name"] not in others and (o.get("spec") or {}).get("nodeName") is None
    ]
    objects.append(node_object("gpu-h100", gpus=8))  # untainted this time
    answer = explain(objects, "train/eight")
    assert isinstance(answer, Pending)
    assert answer.reasons == (("pod needs 8 whole GPUs; node has 7 healthy (1 withheld as unhealthy)", 1),)
    assert answer.hints == ("fits node gpu-h100 once its withheld devices are healthy again: GPU 3",)
    busy = explain([*objects, held("one", "gpu-h100", inventories["gpu-h100"], [0])], "train/eight")
    assert isinstance(busy, Pending)
    assert busy.hints[0] == (
        "fits node gpu-h100 once its withheld devices are healthy again (GPU 3) "
        "and 1 pod(s) there end: train/one"
    )
    nine = explain(objects, "train/nine")
    assert isinstance(nine, Pending)
    assert "no node has 9 whole GPUs: the largest offers 8 (node gpu-h100)" in nine.hints


def _share_and_mig_cluster() -> list[dict[str, Any]]:
    a100, l40s = profile_inventory("dgx-a100", "gpu-a100"), profile_inventory("l40s-pcie-8", "gpu-l40s")
    whole = [held(f"whole-{i}", "gpu-a100", a100, [i]) for i in range(3)]  # GPUs 0-2 busy
    return [
        inventory_object(a100), inventory_object(l40s), node_object("gpu-a100", gpus=8), tainted("gpu-l40s"),
        *whole,
        pod_object("share", namespace="ml", limits={"gpuweave.io/gpu-compute": 25}),
        pod_object("replica", namespace="ml", limits={"gpuweave.io/gpu-shared": 1}),
        pod_object("slices", namespace="ml", limits={"nvidia.com/mig-1g.10gb": 2}),
        pod_object("small", namespace="ml", limits={"nvidia.com/mig-1g.5gb": 1}),
    ]


def test_a_share_pods_hint_names_the_node_and_the_sharing_configuration_to_give_it() -> None:
    """Before: 'no node fits it even with every pod there ended'. The tainted l40s node is not
    offered: kube-scheduler would keep the pod off it whatever its sharing."""
    share = explain(_share_and_mig_cluster(), "ml/share")
    assert isinstance(share, Pending)
    assert share.hints[0].startswith(
        "fits node gpu-a100 once its free GPUs are offered fractional: give its node agent a sharing "
        "configuration with mode fractional; with the chart, an entry of nodeAgent.sharingConfigs"
    )
    assert "kubectl label node gpu-a100 gpuweave.io/sharing-config=shared" in share.hints[0]
    replica = explain(_share_and_mig_cluster(), "ml/replica")
    assert isinstance(replica, Pending) and "offered time-sliced" in replica.hints[0]


def test_a_mig_pods_hint_names_a_layout_on_a_gpu_nothing_holds() -> None:
    slices = explain(_share_and_mig_cluster(), "ml/slices")
    assert isinstance(slices, Pending)
    layout = "gpuweave.io/mig-layout='{\"gpus\": {\"3\": [\"1g.10gb\", \"1g.10gb\"]}}'"
    assert slices.hints[0].startswith("fits node gpu-a100 once its GPU 3 (nothing runs on it) holds MIG")
    assert f"kubectl annotate node gpu-a100 --overwrite {layout}" in slices.hints[0]
    assert "gpuweave mig plan --simulate <the node's profile> --gpu 3 --profiles 1g.10gb,1g.10gb" in (
        slices.hints[0]
    )
    small = explain(_share_and_mig_cluster(), "ml/small")  # an A100 80GB has no 1g.5gb
    assert isinstance(small, Pending)
    assert small.hints[0].startswith(
        "no MIG-capable GPU of these nodes has the profile 1g.5gb: ask for one they offer "
        "(NVIDIA A100-SXM4-80GB: 1g.10gb"
    )
    text = explain_text(slices)
    assert all(len(line) <= WIDTH for line in text.splitlines()) and "mig-layout" in text


def test_placed_pod_shows_devices_topology_and_runners_up(inventories: Any) -> None:
    answer = explain(cluster(inventories), "train/quad")
    assert isinstance(answer, Placed)
    assert answer.node == "gpu-v100" and [g.text for g in answer.devices] == ["GPUs 0,1,2,3"]
    graph = TopologyGraph.from_inventory(inventories["gpu-v100"])
    assert answer.topology == score_set(graph, (0, 1, 2, 3))
    assert 0 < answer.topology.value <= answer.best_value
    by_node = {r.node: r for r in answer.ranking}
    # its own devices count free, so its node fits again and ranks first (NVLink quad vs PCIe)
    assert answer.ranking[0].node == "gpu-v100" and answer.ranking[0].score == 10
    quad = by_node["gpu-v100"].gpus
    assert len(quad) == 4 and score_set(graph, quad).all_nvlink
    assert not by_node["gpu-l40s"].fits  # 2 GPUs free there
    assert not by_node["gpu-h100"].fits and "untolerated taint" in by_node["gpu-h100"].reason


def test_pods_explain_cannot_answer_for_say_why(inventories: Any) -> None:
    with pytest.raises(InvalidInputError, match="pod train/absent is not in the cluster"):
        explain(cluster(inventories), "train/absent")
    with pytest.raises(InvalidInputError, match="asks for no GPU"):
        explain(cluster(inventories), "train/web")


def test_explain_text_fits_80_columns_and_json_parses(
    inventories: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = cluster(inventories)
    for key in ("train/eight", "train/quad", "train/nine"):
        text = explain_text(explain(objects, key))
        assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    document = json.loads(to_json(explain(objects, "train/eight")))
    assert {"reason": "pod needs 8 free GPUs; node has 4 free of 8", "nodes": 1} in document["reasons"]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"kind": "List", "items": objects}))
    assert main(["status", "--snapshot", str(path), "--explain", "train/quad"]) == 0
    assert "pod train/quad runs on node gpu-v100" in capsys.readouterr().out
    assert main(["status", "--snapshot", str(path), "--explain", "quad"]) == 2
    assert "give NAMESPACE/POD" in capsys.readouterr().err


def test_explain_escapes_pod_text_and_clips_a_1_mb_scheduler_message(
    inventories: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the pod's author and kube-scheduler wrote reaches the terminal escaped and cut."""
    hostile = "\x1b[2J\x1b]0;pwned\x07\u202etxt.exe\u2066"
    pod = pod_object("stuck", namespace="train", limits={RESOURCE_GPU: 9})
    pod["metadata"]["annotations"][ANNOTATION_GPU_SELECTOR] = (
        f'device.attributes["gpuweave.io"].productName != "{hostile}"'
    )
    said = "0/3 nodes are available: " + hostile + "\n" + "y" * (1 << 20)
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
    ]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"kind": "List", "items": [*cluster(inventories), pod]}))
    assert main(["status", "--snapshot", str(path), "--explain", "train/stuck"]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\u202e\u2066"), "a raw control or bidi character"
    assert len(out) < 20_000 and max(len(line) for line in out.splitlines()) <= WIDTH
    shown = "\\x1b[2J\\x1b]0;pwned\\x07\\u202etxt.exe\\u2066"
    assert "gpu-selector" in out and shown in out.replace("\n  ", "")
    said_lines = out.split("kube-scheduler said: ", 1)[1].split("what would make it fit:", 1)[0]
    assert "\\n" in said_lines and f"of {len(said)} characters)" in said_lines.replace("\n  ", " ")
    assert main(["status", "--snapshot", str(path), "--explain", "train/stuck", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schedulerSaid"].startswith(said[:40])
    assert len(document["schedulerSaid"]) <= MAX_JSON_CHARS
