"""CDI specs from the served devices, their writer, and Allocate's device-list strategies (pure parts).

The host's device numbers come from a simulated host tree (``write_fake_dev``) read by the
production reader, so the numbers checked here are the ones a real driver publishes the same way.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU, RESOURCE_GPU_SHARED
from devicemodel.inventory import LostGpu, NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.cli import main
from gpuweave.node.cdi import add_cdi_arguments, spec_dir
from hardware.device_nodes import HostDeviceNodes, read_host_device_nodes
from hardware.simulated.dev_tree import write_fake_dev
from nodeagent.allocation import (
    VOLUME_MOUNT_ROOT,
    DeviceListing,
    DeviceListStrategy,
    cdi_annotation_key,
    grant_for,
    parse_strategies,
)
from nodeagent.cdi import CDI_VERSION, CdiPublisher, CdiSpecs, CdiSpecWriter, build_specs, conflicts
from nodeagent.devices import PluginDevice, build_catalogue
from tests.support.small_inventory import gpu_uuid, small_inventory

GPU_FILE, EFA_FILE = "gpuweave-nvidia.com-gpu.json", "gpuweave-vpc.amazonaws.com-efa.json"
MIG = "nvidia.com/mig-3g.40gb"
REPLICAS_2 = SharingPlan(per_gpu={"2": GpuSharing(SharingMode.TIME_SLICED, replicas=2)})
BOTH_CDI = frozenset({DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI})


def host_of(tmp_path: Path, inventory: NodeInventory) -> HostDeviceNodes:
    """The simulated host's /dev and /proc, plus the verbs ``dev`` files the sysfs tree holds."""
    write_fake_dev(tmp_path, inventory)
    for nic in inventory.nics:
        number = int(str(nic.uverbs_device).removeprefix("/dev/infiniband/uverbs"))
        verbs = tmp_path / "sys" / "class" / "infiniband_verbs" / f"uverbs{number}"
        verbs.mkdir(parents=True)
        (verbs / "dev").write_text(f"231:{192 + number}\n")
    return read_host_device_nodes(tmp_path)


def served(inventory: NodeInventory, plan: SharingPlan | None = None) -> list[PluginDevice]:
    return [d for devices in build_catalogue(inventory, plan or SharingPlan()).values() for d in devices]


def nodes(entry: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(n["path"], n["major"], n["minor"]) for n in entry["containerEdits"]["deviceNodes"]]


def test_cdi_gpu_spec_names_every_served_gpu_and_mig_device_with_its_nodes(tmp_path: Path) -> None:
    inventory = small_inventory(mig_on=(1,))
    specs = build_specs(inventory, served(inventory, REPLICAS_2), host=host_of(tmp_path, inventory))
    gpu = specs.files[GPU_FILE]
    assert (gpu["cdiVersion"], gpu["kind"], specs.problems) == (CDI_VERSION, "nvidia.com/gpu", ())
    devices = {d["name"]: d for d in gpu["devices"]}
    migs = [m.uuid for m in inventory.mig_devices]
    # GPU 1 runs MIG: only its MIG devices are served, so its own UUID is not a CDI device.
    assert set(devices) == {gpu_uuid(0), gpu_uuid(2), gpu_uuid(3), *migs}
    assert nodes(devices[gpu_uuid(3)]) == [("/dev/nvidia3", 195, 3)]
    # GPU minor 1, GPU instance k+1, compute instance 0: the driver's table puts gpu1/gi<g>/access
    # at 3 + 1*135 + g*9 and its ci0 right after.
    for k, uuid in enumerate(migs):
        gi_minor = 3 + 135 + (k + 1) * 9
        assert nodes(devices[uuid]) == [
            ("/dev/nvidia1", 195, 1),
            (f"/dev/nvidia-caps/nvidia-cap{gi_minor}", 509, gi_minor),
            (f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1}", 509, gi_minor + 1),
        ]
    common = [(n["path"], n["major"], n["minor"]) for n in gpu["containerEdits"]["deviceNodes"]]
    assert common == [
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia-uvm", 508, 0),
        ("/dev/nvidia-uvm-tools", 508, 1),
        ("/dev/nvidia-modeset", 195, 254),
    ]
    assert all(n["type"] == "c" and n["permissions"] == "rw" for n in gpu["containerEdits"]["deviceNodes"])


def test_cdi_efa_spec_has_each_uverbs_node_and_rdma_cm(tmp_path: Path) -> None:
    inventory = small_inventory()
    efa = build_specs(inventory, served(inventory), host=host_of(tmp_path, inventory)).files[EFA_FILE]
    assert efa["kind"] == "vpc.amazonaws.com/efa"
    assert {d["name"]: nodes(d) for d in efa["devices"]} == {
        "rdmap16s0": [("/dev/infiniband/uverbs0", 231, 192)],
        "rdmap17s0": [("/dev/infiniband/uverbs1", 231, 193)],
    }
    assert [n["path"] for n in efa["containerEdits"]["deviceNodes"]] == ["/dev/infiniband/rdma_cm"]


def test_cdi_spec_leaves_out_lost_gpus_and_absent_control_nodes(tmp_path: Path) -> None:
    inventory = small_inventory(gpus=2)
    host = host_of(tmp_path, inventory)
    (tmp_path / "dev" / "nvidia-modeset").unlink()
    lost = replace(inventory, lost_gpus=(LostGpu(2, gpu_uuid(2), "", "fell off the bus"),))
    spec = build_specs(lost, served(lost), host=read_host_device_nodes(tmp_path)).files[GPU_FILE]
    assert [d["name"] for d in spec["devices"]] == [gpu_uuid(0), gpu_uuid(1)]
    assert "/dev/nvidia-modeset" not in [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert len(host.control) == 4  # it was there before the test removed it


def test_cdi_mig_device_without_a_caps_minor_is_reported(tmp_path: Path) -> None:
    inventory = small_inventory(mig_on=(0,), gpus=1)
    host = replace(host_of(tmp_path, inventory), mig_minors={})
    specs = build_specs(inventory, served(inventory), host=host)
    assert len(specs.problems) == 2
    assert inventory.mig_devices[0].uuid in specs.problems[0] and "mig-minors" in specs.problems[0]


def test_cdi_writer_replaces_its_stale_files_and_keeps_other_tools_files(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / GPU_FILE).write_text('{"kind": "nvidia.com/gpu", "devices": [{"name": "GPU-old"}]}')
    (spec_dir / "gpuweave-example.com-old.yaml").write_text("kind: example.com/old\n")
    (spec_dir / "nvidia.yaml").write_text("kind: nvidia.com/gpu\n")
    inventory = small_inventory(gpus=1)
    specs = build_specs(inventory, served(inventory), host=host_of(tmp_path, inventory))
    writer = CdiSpecWriter(spec_dir)
    writer.write(specs)
    assert sorted(p.name for p in spec_dir.iterdir()) == [GPU_FILE, EFA_FILE, "nvidia.yaml"]
    assert [d["name"] for d in writer.read()[GPU_FILE]["devices"]] == [gpu_uuid(0)]
    inode = (spec_dir / GPU_FILE).stat().st_ino
    writer.write(specs)  # unchanged: not rewritten
    assert (spec_dir / GPU_FILE).stat().st_ino == inode
    writer.write(CdiSpecs({}))
    assert [p.name for p in spec_dir.iterdir()] == ["nvidia.yaml"]


def test_cdi_publisher_defines_old_and_new_devices_until_the_change_is_committed(tmp_path: Path) -> None:
    whole, reshaped = small_inventory(gpus=2), small_inventory(gpus=2, mig_on=(1,))
    host = host_of(tmp_path, reshaped)
    publisher = CdiPublisher(CdiSpecWriter(tmp_path / "cdi"), host=lambda: host)
    publisher.prepare(whole, served(whole))
    publisher.commit()

    def names() -> set[str]:
        return {d["name"] for d in publisher.writer.read()[GPU_FILE]["devices"]}

    migs = {m.uuid for m in reshaped.mig_devices}
    publisher.prepare(reshaped, served(reshaped))
    assert names() == {gpu_uuid(0), gpu_uuid(1), *migs}
    publisher.commit()
    assert names() == {gpu_uuid(0), *migs}


def test_cdi_publisher_survives_an_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    inventory = small_inventory(gpus=1)
    host = host_of(tmp_path, inventory)
    publisher = CdiPublisher(CdiSpecWriter(blocker / "cdi"), host=lambda: host)
    publisher.prepare(inventory, served(inventory))
    publisher.commit()
    assert publisher.failures == 2


def gpus(inventory: NodeInventory) -> dict[str, PluginDevice]:
    return {d.id: d for d in build_catalogue(inventory, SharingPlan())[RESOURCE_GPU]}


def test_cdi_volume_mounts_strategy_lists_devices_as_mounts_not_the_variable() -> None:
    listing = DeviceListing(strategies=frozenset({DeviceListStrategy.VOLUME_MOUNTS}))
    ids = [gpu_uuid(0), gpu_uuid(2)]
    grant = grant_for(RESOURCE_GPU, ids, devices=gpus(small_inventory()), unhealthy={}, listing=listing)
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": VOLUME_MOUNT_ROOT}
    assert [(m.container_path, m.host_path, m.read_only) for m in grant.mounts] == [
        (f"{VOLUME_MOUNT_ROOT}/{i}", "/dev/null", True) for i in ids
    ]
    assert grant.cdi_devices == ()


def test_cdi_only_strategies_set_void_and_name_devices_by_annotation_and_cri() -> None:
    listing = DeviceListing(strategies=BOTH_CDI)
    grant = grant_for(
        RESOURCE_GPU, [gpu_uuid(1)], devices=gpus(small_inventory()), unhealthy={}, listing=listing
    )
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert grant.annotations[cdi_annotation_key(RESOURCE_GPU)] == f"nvidia.com/gpu={gpu_uuid(1)}"
    assert cdi_annotation_key(MIG) == "cdi.k8s.io/gpuweave_nvidia.com_mig-3g.40gb"
    assert grant.cdi_devices == (f"nvidia.com/gpu={gpu_uuid(1)}",)


def test_cdi_replicas_and_efa_grants_carry_their_cdi_names_and_rdma_cm() -> None:
    catalogue = build_catalogue(small_inventory(), REPLICAS_2)
    replicas = {d.id: d for d in catalogue[RESOURCE_GPU_SHARED]}
    listing = DeviceListing(strategies=BOTH_CDI, rdma_cm="/dev/infiniband/rdma_cm")
    replica = grant_for(
        RESOURCE_GPU_SHARED, list(replicas)[:1], devices=replicas, unhealthy={}, listing=listing
    )
    assert replica.cdi_devices == (f"nvidia.com/gpu={gpu_uuid(2)}",)
    efas = {d.id: d for d in catalogue[RESOURCE_EFA]}
    efa = grant_for(RESOURCE_EFA, ["rdmap17s0"], devices=efas, unhealthy={}, listing=listing)
    assert [n.host_path for n in efa.device_nodes] == ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"]
    assert efa.cdi_devices == ("vpc.amazonaws.com/efa=rdmap17s0",)
    assert "NVIDIA_VISIBLE_DEVICES" not in efa.envs


def test_cdi_strategy_names_are_parsed_with_a_specific_error() -> None:
    assert parse_strategies("envvar, cdi-cri") == {DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI}
    with pytest.raises(ValueError, match="unknown cdi; choose one or more of envvar, volume-mounts"):
        parse_strategies("envvar,cdi")
    with pytest.raises(ValueError, match=r"unknown \(empty\)"):
        parse_strategies(" , ")


def node_agent_argv(tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "kubelet").mkdir(exist_ok=True)
    return ["node-agent", "--kubelet-dir", str(tmp_path / "kubelet"), "--state-dir", str(tmp_path / "state"),
            "--simulate", "dgx-h100", "--no-kube", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--device-list-strategy", "envvar,cdi"],
            "--device-list-strategy: device-list strategy 'envvar,cdi': ",
        ),
        (
            ["--cdi-spec-dir", "none"],
            "--device-list-strategy cdi-cri names CDI devices but --cdi-spec-dir is none",
        ),
    ],
)
def test_cdi_node_agent_flags_refuse_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(node_agent_argv(tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cdi_spec_dir_defaults_to_the_runtime_directory_or_the_simulated_state_dir(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_cdi_arguments(parser)
    real = parser.parse_args([])
    real.simulate, real.state_dir = None, tmp_path
    assert spec_dir(real) == Path("/var/run/cdi")
    real.simulate = "dgx-h100"
    assert spec_dir(real) == tmp_path / "cdi"
    real.cdi_spec_dir = "/etc/cdi"
    assert spec_dir(real) == Path("/etc/cdi")


def test_cdi_writer_names_another_tools_spec_that_defines_the_same_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    inventory = small_inventory(gpus=2)
    (spec_dir / "nvidia.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: {gpu_uuid(1)}\n"
    )
    (spec_dir / "broken.json").write_text("{not json")
    specs = build_specs(inventory, served(inventory), host=host_of(tmp_path, inventory))
    assert conflicts(spec_dir, specs) == [
        f"{spec_dir / 'nvidia.yaml'} also defines 1 of the agent's CDI devices "
        f"(nvidia.com/gpu={gpu_uuid(1)}, ...); a runtime resolves neither: stop the tool that writes it "
        "(the NVIDIA Container Toolkit's nvidia-cdi-refresh, or the GPU operator's CDI spec) "
        "or give the agent another --cdi-spec-dir"
    ]
    CdiSpecWriter(spec_dir).write(specs)
    assert "nvidia.yaml also defines 1" in caplog.text
