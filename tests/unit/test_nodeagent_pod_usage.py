"""Per-pod GPU use, the pure parts and the NVML reader: a process's pod from its cgroup (both cgroup
drivers), the processes and per-process samples read through the simulated pynvml surface (MPS
clients, averaging, an idle GPU, accounting), rows per container and GPU, limits, and the grace
before an over-limit pod is evicted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware.gpu_processes import GpuProcess, GpuProcessReader
from hardware.proc_cgroup import ContainerCgroup, container_of, parse_cgroup
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.pod_usage import (
    GIB,
    ContainerKey,
    MemoryLimitWatch,
    PodGpuUsage,
    PodIdentities,
    memory_limits,
    pod_usage,
)
from nodeagent.podresources import ContainerDevices

UID = "6c1f2a3b-1111-4222-8333-444455556666"
CID = "a" * 64


@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        f"0::/kubepods/pod{UID}/{CID}\n",  # a Guaranteed pod: no QoS level
        f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n11:cpu:/kubepods/besteffort/pod{UID}/{CID}\n",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
        f"0::/kubepods/burstable/pod{UID}/{CID}/nested-by-the-tenant\n",
    ],
)
def test_a_process_cgroup_names_its_pod_and_container(text: str) -> None:
    assert parse_cgroup(text) == ContainerCgroup(UID, CID)


@pytest.mark.parametrize(
    "text",
    ["0::/system.slice/gpuweave-node-agent.service\n", "0::/\n", "garbage", "0::/kubepods/burstable/\n"],
)
def test_a_process_outside_every_pod_has_none(text: str) -> None:
    assert parse_cgroup(text) is None


def test_container_of_reads_proc_and_a_gone_process_is_none(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert container_of(tmp_path, 42) == ContainerCgroup(UID, CID)
    assert container_of(tmp_path, 43) is None


@pytest.fixture
def backend() -> SimulatedBackend:
    made = SimulatedBackend(load_profile("l40s-pcie-8"), node_name="n0")
    made.discover()
    return made


def test_the_reader_lists_mps_clients_and_plain_processes_with_their_use(backend: SimulatedBackend) -> None:
    uuid = backend.inventory.gpus[0].uuid
    table = backend.node.processes
    table.run(0, 501, memory_bytes=3 * GIB, sm_percent=30, mps=True)
    table.run(0, 502, memory_bytes=5 * GIB, sm_percent=50, mps=True)
    table.run(0, 9, memory_bytes=GIB // 4, sm_percent=0)  # the MPS server: a plain process
    reader = GpuProcessReader(backend.nvml.caller)
    try:
        found = {p.pid: p for p in reader.processes(uuid)}
        assert found[501] == GpuProcess(501, 3 * GIB, 0.3, mps_client=True)
        assert found[502].sm_utilization == 0.5 and found[502].mps_client
        assert found[9].mps_client is False
        assert reader.processes(backend.inventory.gpus[1].uuid) == ()  # idle: NOT_FOUND samples
    finally:
        backend.close()


def test_without_process_sampling_the_reader_takes_accounting_or_nothing(backend: SimulatedBackend) -> None:
    uuid = backend.inventory.gpus[0].uuid
    table = backend.node.processes
    table.per_process_sampling = False
    table.run(0, 601, memory_bytes=GIB, sm_percent=70)
    reader = GpuProcessReader(backend.nvml.caller)
    try:
        assert reader.processes(uuid)[0].sm_utilization is None  # accounting off
        table.accounting = True
        assert reader.processes(uuid)[0].sm_utilization == 0.7
    finally:
        backend.close()


def identities() -> PodIdentities:
    pods = PodIdentities()
    pods.upsert(
        {
            "metadata": {"uid": UID, "namespace": "team", "name": "infer"},
            "status": {"containerStatuses": [{"name": "server", "containerID": f"containerd://{CID}"}]},
        }
    )
    return pods


def test_rows_sum_a_containers_processes_and_leave_out_processes_in_no_pod() -> None:
    key = ContainerKey("team", "infer", "server")
    samples = {
        "GPU-0": [GpuProcess(1, GIB, 0.2, True), GpuProcess(2, 2 * GIB, 0.1, True), GpuProcess(3, GIB, None)],
        "GPU-1": [GpuProcess(4, GIB, None, True)],
    }
    cgroups = {
        1: ContainerCgroup(UID, CID),
        2: ContainerCgroup(UID, CID),
        4: ContainerCgroup("f" * 32, "b" * 64),
    }
    rows = pod_usage(
        samples,
        cgroups=cgroups,
        pods=identities().get,
        limits={(key, "GPU-0"): 4 * GIB},
        gpu_index={"GPU-0": 0, "GPU-1": 1},
    )
    expected = PodGpuUsage(key, "GPU-0", 0, pytest.approx(0.3), 3 * GIB, 4 * GIB, (1, 2), pod_uid=UID)  # type: ignore[arg-type]
    assert rows[0] == expected  # the UID its cgroup gives: what an eviction is bound to
    assert rows[1].key == ContainerKey("", "f" * 32, "b" * 12)  # a pod the watch does not know yet
    assert rows[1].memory_limit_bytes is None and not rows[1].over_limit


def test_limits_from_memory_units_dra_shares_and_the_daemon_default() -> None:
    containers = [
        ContainerDevices("a", "p1", "c", ("GPU-0::compute-0", "GPU-0::memory-0", "GPU-0::memory-1")),
        ContainerDevices("a", "p2", "c", ("GPU-0::compute-1",)),  # compute only: the daemon's default
        ContainerDevices("a", "p3", "c", ("GPU-7",)),  # a whole GPU: no limit
        ContainerDevices("a", "p4", "c", (), (("a", "claim-4", "gpu-1-share"),)),
    ]
    limits = memory_limits(
        containers,
        share_memory=lambda ns, name, device: ("GPU-1", 6) if name == "claim-4" else None,
        daemon_defaults={"GPU-0": 512 * 2**20},
    )
    assert limits == {
        (ContainerKey("a", "p1", "c"), "GPU-0"): 2 * GIB,
        (ContainerKey("a", "p2", "c"), "GPU-0"): 512 * 2**20,
        (ContainerKey("a", "p4", "c"), "GPU-1"): 6 * GIB,
    }


def row(memory: int) -> PodGpuUsage:
    return PodGpuUsage(ContainerKey("a", "p", "c"), "GPU-0", 0, 0.0, memory, 4 * GIB, (1,))


def test_a_pod_over_its_limit_is_due_after_the_grace_and_once() -> None:
    watch = MemoryLimitWatch(grace_s=30)
    assert watch.observe([row(5 * GIB)], now=0) == []
    assert watch.observe([row(5 * GIB)], now=29) == []
    assert watch.observe([row(5 * GIB)], now=30) == [row(5 * GIB)]
    assert watch.observe([row(5 * GIB)], now=35) == [row(5 * GIB)]  # the eviction was refused (a PDB)
    watch.evicted(row(5 * GIB))
    assert watch.observe([row(5 * GIB)], now=40) == []  # evicted: not again while it terminates


def test_a_pod_back_under_its_limit_starts_over() -> None:
    watch = MemoryLimitWatch(grace_s=30)
    watch.observe([row(5 * GIB)], now=0)
    watch.observe([row(3 * GIB)], now=20)
    assert watch.observe([row(5 * GIB)], now=40) == []  # over again since 40, not since 0
    assert watch.observe([row(5 * GIB)], now=70) == [row(5 * GIB)]
    assert watch.observe([row(4 * GIB)], now=71) == []  # at the limit is not over it
