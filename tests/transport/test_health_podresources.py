"""Health eviction finds the pods on a failed device through the kubelet's pod-resources API too.

Real parts: the pod-resources gRPC server on a unix socket and the production client
(``PodResourcesClient.pod_devices`` wired in as the node agent wires it), the health engine and
remediation over the simulated GPU surface, a recording cluster for the API server's side. Pods
placed without the extender carry no ``gpuweave.io/assignment`` annotation: only the kubelet
knows their devices.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hardware.health_probe import NvmlHealthProbe
from hardware.simulated.health_calls import SimHealthState
from health.config import HealthSettings
from health.policy import DeviceState
from health.service import HealthParts, HealthService
from nodeagent.podresources import PodResourcesClient
from tests.support.agent_process import short_temp_dir
from tests.support.podresources_server import PodResourcesServer
from tests.support.small_inventory import gpu_uuid
from tests.unit.test_health_monitor import FakeClock, SimLib, Sink, efa_sysfs
from tests.unit.test_health_remediation import INVENTORY, RecordingCluster, pod, state_of


@pytest.fixture
def kubelet() -> Iterator[PodResourcesServer]:
    root = short_temp_dir()
    try:
        with PodResourcesServer(root / "pod-resources" / "kubelet.sock") as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


def health_with_kubelet(
    tmp_path: Path, cluster: RecordingCluster, kubelet: PodResourcesServer
) -> tuple[HealthService, SimHealthState]:
    sysfs = efa_sysfs(tmp_path / "sys", [n.name for n in INVENTORY.nics])
    state = SimHealthState(
        [(g.uuid, g.pci_bus_id, 12) for g in INVENTORY.gpus], kmsg_path=tmp_path / "kmsg", sysfs_root=sysfs
    )
    probe = NvmlHealthProbe(SimLib(state), sysfs_root=sysfs, reset=lambda uuid: state.reset(int(uuid[-2:])))
    parts = HealthParts(
        inventory=INVENTORY,
        probe=probe,
        device_ops=probe,
        sink=Sink(),
        state_dir=tmp_path / "state",
        settings=HealthSettings(round_interval_s=0.05, check_timeout_s=0.5, eviction_grace_s=30),
        node_name="node-a",
        kernel_log=tmp_path / "kmsg",
        cluster=cluster,
        clock=FakeClock(),
        pod_devices=PodResourcesClient(kubelet.socket_path, timeout=2).pod_devices,
    )
    health = HealthService(parts)
    health._load_bad_list()
    return health, state


def test_pod_placed_without_the_extender_is_evicted_from_its_failed_gpu(
    tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    untagged, other = pod("untagged"), pod("other")  # no assignment annotation: no devices known
    pinned = pod("pinned", opted_out=True)
    cluster = RecordingCluster([untagged, other, pinned])
    kubelet.admit("ml", "untagged", {"main": {"nvidia.com/gpu": [gpu_uuid(5)]}})
    kubelet.admit("ml", "other", {"main": {"nvidia.com/gpu": [gpu_uuid(4)]}})
    kubelet.admit("ml", "pinned", {"main": {"nvidia.com/gpu": [gpu_uuid(5)]}})
    health, state = health_with_kubelet(tmp_path, cluster, kubelet)
    state.inject_xid(5, 79)
    health.monitor.run_round()
    assert state_of(health, 5) is DeviceState.FAILED
    assert cluster.evicted == ["untagged"]  # the opted-out pod keeps its label's promise
    assert ("GpuweaveDeviceFailed", "untagged") in cluster.events
    kubelet.remove("ml", "untagged")  # terminated: the kubelet frees its GPU
    health.monitor.run_round()
    assert state.gpus[5].resets == 0  # the opted-out pod still holds the GPU
    cluster.pods.remove(pinned)
    kubelet.remove("ml", "pinned")
    health.monitor.run_round()
    assert state.gpus[5].resets == 1
    assert cluster.evicted == ["untagged"] and other in cluster.pods


def test_unreadable_kubelet_evicts_annotated_pods_but_does_not_reset(
    tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    tagged = pod("tagged", gpu_uuid(2))
    cluster = RecordingCluster([tagged])
    health, state = health_with_kubelet(tmp_path, cluster, kubelet)
    kubelet.stop()
    state.inject_xid(2, 79)
    for _ in range(3):
        health.monitor.run_round()
    assert cluster.evicted == ["tagged"]  # the annotation still names it
    assert state.gpus[2].resets == 0  # other pods may hold the GPU: unknown is not "none"
    assert state_of(health, 2) is DeviceState.FAILED
    kubelet.start()
    health.monitor.run_round()
    assert state.gpus[2].resets == 1
