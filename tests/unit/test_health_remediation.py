"""Graded remediation end to end through the engine, the simulated GPU surface and a recording cluster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devicemodel.assignment import device_id_share
from hardware.health_probe import NvmlHealthProbe
from hardware.simulated.health_calls import SimHealthState
from health.badlist import BadGpu, BadHardwareList
from health.config import HealthSettings
from health.policy import DeviceState, PolicySettings
from health.remediation import EvictionOutcome, PodRef
from health.scope import TAINT_HEALTH_PENDING, TAINT_NODE_FAULT, NodeCondition
from health.service import HealthParts, HealthService
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.unit.test_health_monitor import FakeClock, SimLib, Sink, efa_sysfs


class RecordingCluster:
    """The Kubernetes side as remediation sees it: pods, evictions (with PDB refusals), taints, events."""

    def __init__(self, pods: list[PodRef], *, nodes_total: int = 10, tainted_elsewhere: int = 0) -> None:
        self.pods = pods
        self.pdb_refusals = 0
        self.evicted: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.conditions: tuple[NodeCondition, ...] = ()
        self.taints: dict[str, str] = {TAINT_HEALTH_PENDING: ""}
        self.nodes_total, self.tainted_elsewhere = nodes_total, tainted_elsewhere
        self.bad: dict[str, BadGpu] = {}
        self.elsewhere: list[PodRef] = []  # pods on other nodes
        self.refuse_once: set[str] = set()

    def pods_on_node(self) -> list[PodRef]:
        return list(self.pods)

    def gang_pods(self, namespace: str, gang: str) -> list[PodRef]:
        return [p for p in self.pods + self.elsewhere if p.namespace == namespace and p.gang == gang]

    def evict(self, pod: PodRef, *, grace_s: int) -> str:
        if self.pdb_refusals:
            self.pdb_refusals -= 1
            return EvictionOutcome.BLOCKED
        if pod.name in self.refuse_once:  # a PodDisruptionBudget refuses this pod's first eviction
            self.refuse_once.discard(pod.name)
            return EvictionOutcome.BLOCKED
        self.evicted.append(pod.name)
        (self.pods if pod in self.pods else self.elsewhere).remove(pod)  # gone within the grace period
        return EvictionOutcome.EVICTED

    def post_event(
        self, *, reason: str, message: str, pod: PodRef | None = None, warning: bool = True
    ) -> None:
        self.events.append((reason, pod.name if pod else "node"))

    def set_conditions(self, conditions: tuple[NodeCondition, ...]) -> None:
        self.conditions = conditions

    def taint_counts(self, key: str) -> tuple[int, int, bool]:
        mine = key in self.taints
        return self.nodes_total, self.tainted_elsewhere + int(mine), mine

    def set_taint(self, key: str, *, present: bool, value: str = "") -> None:
        if present:
            self.taints[key] = value
        else:
            self.taints.pop(key, None)

    def set_cordon(self, cordoned: bool) -> None:
        pass

    def list_bad_hardware(self) -> dict[str, BadGpu]:
        return dict(self.bad)

    def add_bad_hardware(self, entry: BadGpu) -> None:
        self.bad[entry.uuid] = entry


INVENTORY = small_inventory(gpus=8, mig_on=(6,))


def pod(name: str, *devices: str, opted_out: bool = False) -> PodRef:
    return PodRef("ml", name, frozenset(devices), opted_out)


def service(
    tmp_path: Path, cluster: RecordingCluster | None, *, taints_evict: bool = False, **settings: Any
) -> tuple[HealthService, SimHealthState, Sink]:
    state = SimHealthState(
        [(g.uuid, g.pci_bus_id, 12) for g in INVENTORY.gpus],
        kmsg_path=tmp_path / "kmsg",
        sysfs_root=efa_sysfs(tmp_path / "sys", [n.name for n in INVENTORY.nics])
        if not (tmp_path / "sys").exists()
        else tmp_path / "sys",
    )
    probe = NvmlHealthProbe(
        SimLib(state), sysfs_root=tmp_path / "sys", reset=lambda uuid: state.reset(int(uuid[-2:]))
    )
    sink = Sink()
    parts = HealthParts(
        inventory=INVENTORY,
        probe=probe,
        device_ops=probe,
        sink=sink,
        state_dir=tmp_path / "state",
        settings=HealthSettings(round_interval_s=0.05, check_timeout_s=0.5, eviction_grace_s=30, **settings),
        node_name="node-a",
        kernel_log=tmp_path / "kmsg",
        cluster=cluster,
        clock=FakeClock(),
        taints_evict=taints_evict,
    )
    health = HealthService(parts)
    health._load_bad_list()
    return health, state, sink


def state_of(health: HealthService, index: int) -> DeviceState:
    return health.snapshot().gpus[gpu_uuid(index)].state


def test_failed_gpu_evicts_only_its_pods_then_resets_and_recovers(tmp_path: Path) -> None:
    on5 = pod("trainer", gpu_uuid(5))
    shared5 = pod("notebook", device_id_share(gpu_uuid(5), "replica", 2))
    keep = pod("keep", gpu_uuid(5), opted_out=True)
    other = pod("other", gpu_uuid(4))
    cluster = RecordingCluster([on5, shared5, keep, other])
    cluster.pdb_refusals = 1
    health, state, sink = service(tmp_path, cluster)
    state.inject_xid(5, 79)
    health.monitor.run_round()  # kernel log: Xid 79 -> Failed; trainer's eviction refused by a PDB
    assert state_of(health, 5) is DeviceState.FAILED
    assert cluster.evicted == ["notebook"]
    health.monitor.run_round()
    assert sorted(cluster.evicted) == ["notebook", "trainer"]
    assert state_of(health, 5) is DeviceState.FAILED  # the opted-out pod still runs: no reset
    cluster.pods.remove(keep)
    health.monitor.run_round()
    assert state.gpus[5].resets == 1
    assert state_of(health, 5) is DeviceState.PROBATION
    health.monitor.run_round()
    health.monitor.run_round()
    assert state_of(health, 5) is DeviceState.HEALTHY
    assert sink.health[gpu_uuid(5)] is True
    assert other in cluster.pods
    assert ("GpuweaveDeviceFailed", "trainer") in cluster.events
    health.monitor.run_round()  # transitions are announced at the next round
    node_events = [reason for reason, subject in cluster.events if subject == "node"]
    assert "GpuweaveDeviceFailed" in node_events
    assert node_events[-1] == "GpuweaveDeviceHealthy"


@pytest.mark.parametrize("whole_gang", [True, False])
def test_a_failed_gpu_evicts_the_whole_gang_of_its_pod_unless_the_gang_says_pod(
    tmp_path: Path, whole_gang: bool
) -> None:
    """The member on GPU 5 goes; its gang's members on other nodes go with it (one PDB refusal
    waits a round), except with ``gpuweave.io/gang-eviction: pod``; other pods stay."""
    key = "ml/gang:train"
    member = replace(pod("train-0", gpu_uuid(5)), gang=key, whole_gang=whole_gang)
    others = [replace(pod(f"train-{i}"), gang=key, whole_gang=whole_gang) for i in (1, 2)]
    stranger = replace(pod("other-gang-0"), gang="ml/gang:other")
    cluster = RecordingCluster([member, pod("bystander", gpu_uuid(4))])
    cluster.elsewhere = [*others, stranger]
    health, state, _ = service(tmp_path, cluster)
    state.inject_xid(5, 79)
    health.monitor.run_round()
    if not whole_gang:
        health.monitor.run_round()
        assert cluster.evicted == ["train-0"]
        return
    assert sorted(cluster.evicted) == ["train-0", "train-1", "train-2"]
    assert ("GpuweaveGangEvicted", "train-1") in cluster.events
    assert cluster.elsewhere == [stranger] and [p.name for p in cluster.pods] == ["bystander"]


def test_a_member_that_says_its_gang_goes_pod_by_pod_stays_when_another_member_fails(tmp_path: Path) -> None:
    """Its own pod says a fault evicts only the pods on the failed device (the admission policy
    refuses the agent any other eviction of it), so the chase leaves it and still completes."""
    key = "ml/gang:train"
    member = replace(pod("train-0", gpu_uuid(5)), gang=key)
    says_pod = replace(pod("train-1"), gang=key, whole_gang=False)
    cluster = RecordingCluster([member])
    cluster.elsewhere = [says_pod, replace(pod("train-2"), gang=key)]
    health, state, _ = service(tmp_path, cluster)
    state.inject_xid(5, 79)
    health.monitor.run_round()
    health.monitor.run_round()
    assert sorted(cluster.evicted) == ["train-0", "train-2"]
    assert cluster.elsewhere == [says_pod]


def test_with_device_taints_the_agent_evicts_none_of_the_devices_pods_and_resets_once_they_left(
    tmp_path: Path,
) -> None:
    """DRA mode: the device-taint eviction controller owns the eviction of the failed device's
    pods (one owner: the agent's own eviction, with its longer grace, would race it and win);
    the agent waits for them to leave before the reset, and still chases the gang's members."""
    key = "ml/gang:train"
    member = replace(pod("train-0", gpu_uuid(5)), gang=key)
    cluster = RecordingCluster([member, pod("claim-user", gpu_uuid(5))])
    cluster.elsewhere = [replace(pod("train-1"), gang=key)]
    health, state, _ = service(tmp_path, cluster, taints_evict=True)
    state.inject_xid(5, 79)
    health.monitor.run_round()
    health.monitor.run_round()
    assert cluster.evicted == ["train-1"]  # the gang's member elsewhere; none of the device's pods
    assert state.gpus[5].resets == 0 and state_of(health, 5) is DeviceState.FAILED
    cluster.pods.clear()  # the controller evicted them
    health.monitor.run_round()
    assert state.gpus[5].resets == 1


def test_a_gang_member_refused_by_a_pdb_is_evicted_a_round_later(tmp_path: Path) -> None:
    key = "ml/gang:train"
    cluster = RecordingCluster([replace(pod("train-0", gpu_uuid(5)), gang=key)])
    cluster.elsewhere = [replace(pod("train-1"), gang=key)]
    cluster.refuse_once = {"train-1"}
    health, state, _ = service(tmp_path, cluster)
    state.inject_xid(5, 79)
    health.monitor.run_round()
    assert cluster.evicted == ["train-0"]
    health.monitor.run_round()
    assert cluster.evicted == ["train-0", "train-1"]
    cluster.elsewhere.append(replace(pod("train-2"), gang=key))  # created after: not chased
    health.monitor.run_round()
    assert cluster.evicted == ["train-0", "train-1"]


def test_reset_waits_for_processes_on_the_gpu(tmp_path: Path) -> None:
    health, state, _ = service(tmp_path, None)
    state.set_processes(2, (4242,))
    state.inject_xid(2, 48)
    health.monitor.run_round()
    health.monitor.run_round()
    assert state.gpus[2].resets == 0
    assert state_of(health, 2) is DeviceState.FAILED
    state.set_processes(2, ())
    health.monitor.run_round()
    assert state.gpus[2].resets == 1


def fail_once(health: HealthService, state: SimHealthState, index: int) -> None:
    state.inject_xid(index, 79)
    for _ in range(3):
        health.monitor.run_round()


def test_three_failures_put_the_gpu_on_the_bad_list_across_restarts(tmp_path: Path) -> None:
    cluster = RecordingCluster([])
    health, state, _ = service(tmp_path, cluster)
    fail_once(health, state, 3)
    fail_once(health, state, 3)
    assert state_of(health, 3) is DeviceState.HEALTHY
    state.inject_xid(3, 79)
    health.monitor.run_round()
    assert state_of(health, 3) is DeviceState.RETIRED
    assert gpu_uuid(3) in BadHardwareList(tmp_path / "state")
    assert gpu_uuid(3) in cluster.bad
    restarted, _, sink = service(tmp_path, RecordingCluster([]))
    assert state_of(restarted, 3) is DeviceState.RETIRED
    restarted.monitor.publish()
    assert sink.health[gpu_uuid(3)] is False


def test_strikes_survive_a_restart(tmp_path: Path) -> None:
    health, state, _ = service(tmp_path, None)
    fail_once(health, state, 1)
    fail_once(health, state, 1)
    restarted, state2, _ = service(tmp_path, None, policy=PolicySettings(strike_limit=3))
    state2.inject_xid(1, 79)
    restarted.monitor.run_round()
    assert state_of(restarted, 1) is DeviceState.RETIRED


def test_gpu_listed_by_another_node_is_refused(tmp_path: Path) -> None:
    cluster = RecordingCluster([])
    cluster.bad[gpu_uuid(0)] = BadGpu(
        gpu_uuid(0), "Xid 79 three times", "node-b", "2026-01-01T00:00:00+00:00", 3
    )
    health, _, _ = service(tmp_path, cluster)
    assert state_of(health, 0) is DeviceState.RETIRED
    assert state_of(health, 1) is DeviceState.HEALTHY


def test_mig_fault_recreates_that_instance(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    health, state, _ = service(tmp_path, None)
    health.remediator.recreate_mig = lambda gpu, mig: calls.append((gpu, mig)) is None
    mig = INVENTORY.mig_devices_of(6)[1]
    state.inject_xid(6, 95, gpu_instance=mig.gpu_instance_id, compute_instance=0)
    health.monitor.run_round()
    assert calls == [(gpu_uuid(6), mig.uuid)]
    assert health.snapshot().migs[mig.uuid].state is DeviceState.PROBATION
    assert state.gpus[6].resets == 0


@pytest.mark.parametrize(("elsewhere", "tainted"), [(0, True), (1, False)])
def test_node_fault_taint_respects_the_disruption_cap(tmp_path: Path, elsewhere: int, tainted: bool) -> None:
    cluster = RecordingCluster([], nodes_total=10, tainted_elsewhere=elsewhere)
    health, state, _ = service(tmp_path, cluster, disruption_cap_fraction=0.1)
    state.set_efa(INVENTORY.nics[0].name, present=False)
    health.monitor.run_round()
    assert (TAINT_NODE_FAULT in cluster.taints) is tainted
    efa = next(c for c in cluster.conditions if c.type == "EfaHealthy")
    assert efa.status == "False"
    blocked = ("GpuweaveNodeTaintBlocked", "node") in cluster.events
    assert blocked is not tainted


def test_startup_taint_goes_after_two_clean_rounds_and_node_fault_clears(tmp_path: Path) -> None:
    cluster = RecordingCluster([])
    health, state, _ = service(tmp_path, cluster)
    state.set_efa(INVENTORY.nics[1].name, link_up=False)
    health.monitor.run_round()
    assert TAINT_HEALTH_PENDING in cluster.taints
    assert TAINT_NODE_FAULT in cluster.taints
    state.clear()
    health.monitor.run_round()
    health.monitor.run_round()
    assert TAINT_HEALTH_PENDING not in cluster.taints
    assert TAINT_NODE_FAULT not in cluster.taints


class UnreachableCluster(RecordingCluster):
    """The API server is down: every call fails as the client does on a refused connection."""

    down = True

    def pods_on_node(self) -> list[PodRef]:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        return super().pods_on_node()

    def taint_counts(self, key: str) -> tuple[int, int, bool]:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        return super().taint_counts(key)

    def post_event(
        self, *, reason: str, message: str, pod: PodRef | None = None, warning: bool = True
    ) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        super().post_event(reason=reason, message=message, pod=pod, warning=warning)


def test_api_server_outage_keeps_the_device_withheld_and_remediation_waits(tmp_path: Path) -> None:
    cluster = UnreachableCluster([pod("trainer", gpu_uuid(5))])
    health, state, sink = service(tmp_path, cluster)
    state.inject_xid(5, 79)
    health.monitor.run_round()
    health.monitor.run_round()
    assert state_of(health, 5) is DeviceState.FAILED
    assert sink.health[gpu_uuid(5)] is False
    assert state.gpus[5].resets == 0  # its pod could not be evicted: no reset under it
    assert all(sink.health[g.uuid] for g in INVENTORY.gpus if g.index != 5)
    cluster.down = False
    for _ in range(4):
        health.monitor.run_round()
    assert cluster.evicted == ["trainer"]
    assert state.gpus[5].resets == 1
    assert state_of(health, 5) is DeviceState.HEALTHY
