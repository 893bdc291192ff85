"""`gpuweave status` rows and their text: built by the extender's cache from published objects."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from devicemodel.assignment import ContainerAssignment, PodAssignment, device_id_share
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    mig_resource_name,
)
from devicemodel.inventory import MigDevice, NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.cli import main
from gpuweave.simulate.cluster_objects import node_object, pod_object, profile_inventory
from gpuweave.status.cluster_view import ClusterView
from gpuweave.status.rows import HEALTHY, RETIRED, WITHHELD, cluster_status
from gpuweave.status.text import WIDTH, status_text, to_json
from nodeagent.published import inventory_object
from scheduler_ext.decide.workload import COLD_START_PRIOR
from topology.fragmentation import node_fragment

LONG_NAMESPACE = "a-namespace-with-a-long-name"
LONG_NAME = "a-pod-whose-name-alone-would-fill-half-a-terminal"
LONG = f"{LONG_NAMESPACE}/{LONG_NAME}"


def bound(name: str, node: str, devices: dict[str, list[str]], *, namespace: str = "train") -> dict[str, Any]:
    """A running pod holding ``devices`` (its limits ask for as many of each resource)."""
    limits = {resource: len(ids) for resource, ids in devices.items()}
    pod = pod_object(name, namespace=namespace, limits=limits, node=node, phase="Running")
    assignment = PodAssignment(node=node, containers={"main": ContainerAssignment(devices=devices)})
    pod["metadata"]["annotations"][ANNOTATION_ASSIGNMENT] = assignment.to_annotation()
    return pod


def with_migs(inventory: NodeInventory, gpu: int, profiles: list[str]) -> NodeInventory:
    parent = inventory.gpu(gpu)
    gpus = [replace(g, mig_enabled=True) if g.index == gpu else g for g in inventory.gpus]
    migs = [
        MigDevice(
            uuid=f"MIG-{gpu:04x}{slot:04x}-0000-4000-8000-{len(inventory.name):012x}",
            parent_uuid=parent.uuid,
            parent_index=gpu,
            profile=profile,
            gpu_instance_id=slot + 1,
            compute_instance_id=0,
            placement_start=slot,
            placement_size=1,
            memory_mib=10240,
            compute_slices=1,
        )
        for slot, profile in enumerate(profiles)
    ]
    return replace(inventory, gpus=tuple(gpus), mig_devices=tuple(migs))


@pytest.fixture
def cluster() -> tuple[list[dict[str, Any]], NodeInventory, NodeInventory]:
    h100 = profile_inventory("dgx-h100", "gpu-h100")
    a100 = with_migs(profile_inventory("dgx-a100", "gpu-a100"), 0, ["1g.10gb", "1g.10gb", "3g.40gb"])
    share_uuid = a100.gpus[7].uuid
    objects = [
        inventory_object(
            h100,
            withheld={h100.gpus[3].uuid: "Xid 79: GPU fell off the bus (suspect)"},
            faults={h100.gpus[6].uuid: "Failed: Xid 48 (DBE)"},
        ),
        inventory_object(a100, sharing=SharingPlan(per_gpu={"7": GpuSharing(SharingMode.FRACTIONAL)})),
        node_object("gpu-h100", gpus=8),
        node_object("gpu-a100", gpus=8),
        node_object("cpu-only"),
        bound("pair", "gpu-h100", {RESOURCE_GPU: [h100.gpus[0].uuid, h100.gpus[1].uuid]}),
        bound(LONG_NAME, "gpu-h100", {RESOURCE_GPU: [h100.gpus[2].uuid]}, namespace=LONG_NAMESPACE),
        bound("slice", "gpu-a100", {mig_resource_name("1g.10gb"): [a100.mig_devices[1].uuid]}),
        bound(
            "share",
            "gpu-a100",
            {
                RESOURCE_GPU_COMPUTE: [device_id_share(share_uuid, "compute", u) for u in range(40)],
                RESOURCE_GPU_MEMORY: [device_id_share(share_uuid, "memory", u) for u in range(10)],
            },
        ),
        {
            "kind": "GpuBadHardware",
            "metadata": {"name": "x"},
            "spec": {
                "uuid": h100.gpus[5].uuid,
                "node": "gpu-h100",
                "reason": "3 strikes of Xid 48",
                "strikes": 3,
            },
        },
    ]
    return objects, h100, a100


def test_rows_show_holders_health_and_mig_layout_as_the_extender_sees_them(cluster: Any) -> None:
    objects, _, a100 = cluster
    status = cluster_status(ClusterView.of(objects))
    nodes = {n.name: n for n in status.nodes}
    assert status.without_inventory == ("cpu-only",)
    h = {g.index: g for g in nodes["gpu-h100"].gpus}
    assert [hd.pod for hd in h[0].holders] == ["train/pair"] and h[0].free == "held"
    assert [hd.pod for hd in h[2].holders] == [LONG]
    assert (h[3].health, h[3].reason, h[3].free) == (WITHHELD, "Xid 79: GPU fell off the bus (suspect)", "-")
    assert (h[5].health, h[5].reason) == (RETIRED, "3 strikes of Xid 48")
    assert h[4].health == HEALTHY and h[4].free == "free" and not h[4].holders
    assert (h[6].health, h[6].reason) == ("failed", "Failed: Xid 48 (DBE)")  # the state the agent names
    assert nodes["gpu-h100"].free_gpus == 3  # 8 - 3 held - 2 withheld (the listed GPU: the agent refuses it)
    a = {g.index: g for g in nodes["gpu-a100"].gpus}
    assert a[0].sharing == "mig" and a[0].free == "2/3 free"
    migs = [(m.profile, m.holder) for m in a[0].migs]
    assert migs == [("1g.10gb", ""), ("1g.10gb", "train/slice"), ("3g.40gb", "")]
    assert (a[7].sharing, a[7].free) == ("fractional", "60% free")
    assert [(hd.pod, hd.holds) for hd in a[7].holders] == [("train/share", "40% compute, 10 GiB")]
    assert a[0].product == a100.gpus[0].product and nodes["gpu-a100"].topology == "nvswitch-8"


def test_an_inventory_without_its_node_shows_nothing_free(cluster: Any) -> None:
    """After a scale-down the Node is gone; its GpuNodeInventory (and a bound pod's record) may
    stay behind until the garbage collector deletes it: none of its GPUs is shown or counted."""
    objects, _, _ = cluster
    gone = [o for o in objects if not (o["kind"] == "Node" and o["metadata"]["name"] == "gpu-h100")]
    before = cluster_status(ClusterView.of(objects))
    status = cluster_status(ClusterView.of(gone))
    assert [n.name for n in status.nodes] == ["gpu-a100"]
    assert status.without_inventory == ("cpu-only",)
    assert status.idle_milli < before.idle_milli


def test_fragment_is_fgd_of_the_free_gpus_for_the_mix(cluster: Any) -> None:
    objects, _, _ = cluster
    status = cluster_status(ClusterView.of(objects))
    nodes = {n.name: n for n in status.nodes}
    # H100: GPUs 4, 5, 7 free (3 and 6 withheld, 0..2 held); the 8-GPU and 2-GPU shapes decide
    expected = node_fragment(
        cpu_free=1 << 40,
        gpu_free=[1000] * 3,
        gpu_model="NVIDIA H100 80GB HBM3",
        workload=COLD_START_PRIOR,
        memory_free=1 << 40,
    )
    assert nodes["gpu-h100"].fragment_milli == pytest.approx(expected)
    assert expected > 0  # the prior's 8-GPU share cannot use 4 free GPUs
    assert nodes["gpu-h100"].idle_milli == 3000
    assert nodes["gpu-a100"].idle_milli == 6 * 1000 + 600  # GPUs 1..6 free plus 60% of the share GPU
    assert status.fragment_milli == pytest.approx(sum(n.fragment_milli for n in status.nodes))
    assert status.mix == "cold-start mix"


def test_node_filter_keeps_the_cluster_totals(cluster: Any) -> None:
    objects, _, _ = cluster
    whole = cluster_status(ClusterView.of(objects))
    one = cluster_status(ClusterView.of(objects), node="gpu-a100")
    assert [n.name for n in one.nodes] == ["gpu-a100"] and one.without_inventory == ()
    assert one.fragment_milli == whole.fragment_milli


def test_text_fits_80_columns_and_names_every_pod_and_reason(cluster: Any) -> None:
    objects, _, _ = cluster
    text = status_text(cluster_status(ClusterView.of(objects)))
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    for needle in (
        "train/pair",
        "train/slice",
        "train/share (40% compute, 10 GiB)",
        "Xid 79: GPU fell off",
        "retired",
        "3 strikes of Xid 48",
        "BAD-HARDWARE LIST (1 GPU,",
        "cpu-only",
        "1g.10gb",
    ):
        assert needle in text, needle
    assert LONG[:30] in text and LONG not in text  # cut with an ellipsis, not folded by the terminal


def test_json_is_camel_case_and_complete(cluster: Any) -> None:
    objects, h100, _ = cluster
    document = json.loads(to_json(cluster_status(ClusterView.of(objects))))
    node = next(n for n in document["nodes"] if n["name"] == "gpu-h100")
    assert node["freeGpus"] == 3 and "fragmentMilli" in node
    gpu3 = next(g for g in node["gpus"] if g["index"] == 3)
    assert gpu3["uuid"] == h100.gpus[3].uuid and gpu3["health"] == "withheld"
    assert document["badHardware"][0]["strikes"] == 3


def test_cli_reads_a_snapshot(tmp_path: Any, cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    objects, _, _ = cluster
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"kind": "List", "items": objects}))
    assert main(["status", "--snapshot", str(path), "--node", "gpu-h100"]) == 0
    out = capsys.readouterr().out
    assert "NODE gpu-h100" in out and "NODE gpu-a100" not in out
    assert main(["status", "--snapshot", str(path), "--node", "nope"]) == 2
    assert "node nope is not in the cluster" in capsys.readouterr().err


def test_text_escapes_what_pods_and_agents_wrote(cluster: Any) -> None:
    """A pod name from a snapshot and a bad-hardware reason carrying escapes reach the screen escaped."""
    objects, h100, _ = cluster
    objects = [o for o in objects if o.get("kind") != "GpuBadHardware"]
    hostile = "\x1b]0;pwned\x07\u202eevil\x1b[2J"
    reason = hostile + "r" * 100_000
    objects.append(bound(f"pod{hostile}", "gpu-h100", {RESOURCE_GPU: [h100.gpus[4].uuid]}))
    bad = {"uuid": h100.gpus[5].uuid, "node": "gpu-h100", "reason": reason, "strikes": 3}
    objects.append({"kind": "GpuBadHardware", "metadata": {"name": "x"}, "spec": bad})
    text = status_text(cluster_status(ClusterView.of(objects)))
    assert not any(c in text for c in "\x1b\x07\u202e")
    assert "train/pod\\x1b]0;pwned" in text and "\\x1b]0;pwned\\x07\\u202eevil\\x1b[2J" in text
    assert len(text) < 10_000 and f"of {len(reason)} characters)" in text.replace("\n      ", " ")


def _pending(name: str, *, message: str | None = None, scheduler: str = "gpuweave-scheduler",
             created: str = "2025-01-01T00:00:00Z", limits: dict[str, int] | None = None) -> dict[str, Any]:
    pod = pod_object(name, namespace="ml", limits={RESOURCE_GPU: 8} if limits is None else limits)
    pod["spec"]["schedulerName"] = scheduler
    pod["metadata"]["creationTimestamp"] = created
    if message is not None:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": message, "lastTransitionTime": "2025-01-01T00:05:00Z"}
        pod["status"]["conditions"] = [condition]
    return pod


def test_pending_pods_of_the_gpuweave_scheduler_are_listed_with_scheduler_reasons(cluster: Any) -> None:
    """docs/operations.md shows a pending pod under the nodes; status listed none before."""
    objects, _, _ = cluster
    said = "0/3 nodes are available: 3 pod needs 8 free GPUs; node has 4 free of 8."
    hostile = "0/3 nodes are available:\x1b[2J\u202e " + "x" * 5000
    pending = [
        _pending("train-1", message=said, created="2025-01-01T00:02:00Z"),
        _pending("train-0", message=hostile),
        _pending("fresh", created="2025-01-01T00:03:00Z", limits={"gpuweave.io/gpu-compute": 25}),
        _pending("elsewhere", message=said, scheduler="default-scheduler"),
        _pending("cpu-only", message=said, limits={}),
    ]
    status = cluster_status(ClusterView.of([*objects, *pending]))
    assert [(p.pod, p.asks) for p in status.pending] == [
        ("ml/train-0", "8 GPUs"),
        ("ml/train-1", "8 GPUs"),
        ("ml/fresh", "25% compute + 0 GiB of one GPU"),
    ]
    assert (status.pending[1].reason, status.pending[1].since) == (said, "2025-01-01T00:05:00Z")
    assert status.pending[2].reason.startswith("not tried by gpuweave-scheduler yet")
    text = status_text(status)
    assert "PENDING (3 pods of gpuweave-scheduler asking for GPUs)" in text
    assert "  ml/train-1: 8 GPUs" in text and "3 pod needs 8 free GPUs" in text
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b" in text  # escaped, as every reason
    assert "cut " in text and all(len(line) <= WIDTH for line in text.splitlines())
    listed = [p["pod"] for p in json.loads(to_json(status))["pending"]]
    assert listed == ["ml/train-0", "ml/train-1", "ml/fresh"]
    assert cluster_status(ClusterView.of([*objects, *pending]), node="gpu-h100").pending == ()
