"""The hardware health probe against the simulated pynvml library of a whole node (p5.48xlarge)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hardware.gpu_reset import GpuInUseError
from hardware.health_probe import NvmlHealthProbe, ProbeError
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.health_calls import SimHealthError


@pytest.fixture
def p5(tmp_path: Path) -> Iterator[tuple[SimulatedBackend, NvmlHealthProbe]]:
    backend = SimulatedBackend(load_profile("p5.48xlarge"), tmp_path / "root", kmsg_path=tmp_path / "kmsg")
    backend.discover()
    probe = NvmlHealthProbe(
        backend.lib, sysfs_root=tmp_path / "root" / "sys", reset=backend.node.health.reset_uuid
    )
    yield backend, probe
    backend.close()


def test_clean_node_reads_clean(p5: tuple[SimulatedBackend, NvmlHealthProbe]) -> None:
    backend, probe = p5
    gpu = backend.inventory.gpus[0]
    readings = probe.read_gpu(gpu.uuid, expected_nvlinks=18)
    assert (readings.volatile_dbe, readings.nvlinks_down, readings.nvlinks_active) == (0, (), 18)
    assert readings.remapped_rows == (0, 0, False, False)
    adapters = probe.read_efa()
    assert len(adapters) == 32
    assert {a.name for a in adapters} == {n.name for n in backend.inventory.nics}


def test_faults_show_on_the_production_read_path(p5: tuple[SimulatedBackend, NvmlHealthProbe]) -> None:
    backend, probe = p5
    health = backend.node.health
    uuids = [g.uuid for g in backend.inventory.gpus]
    assert probe.register_events(uuids) == []
    health.set_nvlink_down(3, 17)
    health.inject_ecc_dbe(2, 1)
    assert probe.read_gpu(uuids[3], expected_nvlinks=18).nvlinks_down == (17,)
    assert probe.read_gpu(uuids[2], expected_nvlinks=18).volatile_dbe == 1
    event = probe.wait_event(100)
    assert event is not None and event.is_dbe and event.gpu_uuid == uuids[2]
    health.inject_xid(5, 79)
    event = probe.wait_event(100)
    assert event is not None and (event.gpu_uuid, event.xid) == (uuids[5], 79)  # named although lost
    with pytest.raises(ProbeError) as lost:
        probe.read_gpu(uuids[5], expected_nvlinks=18)
    assert lost.value.kind == "lost"
    assert probe.wait_event(20) is None
    first = backend.inventory.nics[0].name
    with pytest.raises(SimHealthError, match="no netdev"):
        health.set_efa(first, link_up=False)  # p5 EFA interfaces are EFA-only
    health.set_efa(first, present=False)
    assert first not in {a.name for a in probe.read_efa()}
    health.clear()
    assert len(probe.read_efa()) == 32


def test_reset_rules(p5: tuple[SimulatedBackend, NvmlHealthProbe]) -> None:
    backend, probe = p5
    health = backend.node.health
    uuid = backend.inventory.gpus[5].uuid
    health.inject_xid(5, 79)
    health.set_processes(5, (77,))
    with pytest.raises(GpuInUseError):
        probe.reset_gpu(uuid)  # a lost GPU cannot list its processes: the reset itself refuses
    health.set_processes(5, ())
    probe.reset_gpu(uuid)
    assert probe.read_gpu(uuid, expected_nvlinks=18).volatile_dbe == 0
    assert health.gpus[5].resets == 1
