"""Health of the real node-agent process through its own faults: a full state disk, a bad kernel line.

The agent's state directory is a small tmpfs (``tests/support/small_fs.py``): filling it makes every
state write fail with the kernel's ENOSPC, as on a full node disk. Faults are injected with
``gpuweave sim inject``; what the kubelet emulator sees is the outcome under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_process import remove_tree, short_temp_dir
from tests.support.small_fs import fill, free, small_tmpfs
from tests.transport.test_health_agent import Node, ready


@pytest.fixture
def small_disk_node() -> Iterator[tuple[Node, Path]]:
    root = short_temp_dir()
    with small_tmpfs(root / "s", size_kib=512) as state_dir:
        node = Node("p5.48xlarge", root=root)
        try:
            node.wait(lambda: ready(node), "the agent to pass two check rounds")
            yield node, state_dir
        finally:
            node.agent.stop()
            node.kubelet.stop()
    remove_tree(root)


def test_a_full_state_disk_never_stops_health_checking(small_disk_node: tuple[Node, Path]) -> None:
    node, state_dir = small_disk_node
    fill(state_dir)
    node.inject("--gpu", "1", "--nvlink-down", "3")
    node.inject("--gpu", "2", "--ecc-dbe", "3")
    node.wait(lambda: not {node.uuid(1), node.uuid(2)} & node.healthy_gpus(), "GPUs 1 and 2 to be withheld")
    node.wait(lambda: "health-strikes.json" in node.status()["unsavedState"], "the unsaved strikes reported")
    rounds = node.status()["rounds"]
    node.wait(lambda: node.status()["rounds"] >= rounds + 3, "three more check rounds on the full disk")
    free(state_dir)
    node.wait(lambda: node.status()["unsavedState"] == {}, "the state files to be saved once space returns")
    assert (state_dir / "health-strikes.json").exists()
    node.inject("--gpu", "3", "--ecc-dbe", "1")
    node.wait(lambda: node.uuid(3) not in node.healthy_gpus(), "a later fault (GPU 3) to be withheld too")


def test_a_corrupt_kernel_line_is_skipped_and_a_valid_xid_in_the_batch_acts(
    small_disk_node: tuple[Node, Path],
) -> None:
    node, state_dir = small_disk_node
    gpu4 = node.inventory.gpu(4).pci_bus_id.split(".")[0].lower()
    with (state_dir / "kmsg").open("a") as log:  # the driver wrote both lines between two rounds
        log.write(f"NVRM: Xid (PCI:{gpu4}): " + "9" * 5000 + ", pid=1, corrupt\n")
        log.write(f"NVRM: Xid (PCI:{gpu4}): 48, pid=1, DBE\n")
    node.wait(lambda: node.uuid(4) not in node.healthy_gpus(), "GPU 4 withheld for the valid Xid 48")
    assert node.status()["gpus"][node.uuid(4)]["lastXid"] == 48
    rounds = node.status()["rounds"]
    node.wait(lambda: node.status()["rounds"] >= rounds + 2, "the round loop to go on")
