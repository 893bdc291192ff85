"""The simulated workload's share pods run MPS clients on their GPUs, which the simulated NVML
lists with the pod's cgroup, and which end with the pod."""

from __future__ import annotations

from pathlib import Path

from gpuweave.simulate.share_processes import GIB, ShareProcesses
from hardware.proc_cgroup import container_of
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend


def test_a_share_pod_runs_a_client_on_its_gpu_for_as_long_as_it_runs(tmp_path: Path) -> None:
    backend = SimulatedBackend(load_profile("l40s-pcie-8"), tmp_path / "hw", node_name="n0")
    try:
        lib = backend.lib
        lib.nvmlInit()
        gpu = backend.inventory.gpus[2]
        shares = ShareProcesses(backend.node.processes)
        devices = {
            "gpuweave.io/gpu-compute": [f"{gpu.uuid}::compute-{k}" for k in range(40)],
            "gpuweave.io/gpu-memory": [f"{gpu.uuid}::memory-{k}" for k in range(10)],
        }
        shares.start("job-7/pod-0", devices, gpu_index={gpu.uuid: 2})
        (client,) = lib.nvmlDeviceGetMPSComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(2))
        assert client.usedGpuMemory == 6 * GIB  # 60% of its 10 GiB limit
        (sample,) = lib.nvmlDeviceGetProcessUtilization(lib.nvmlDeviceGetHandleByIndex(2), 0)
        assert sample.smUtil == 32  # 80% of its 40 compute units
        assert container_of(backend.sysfs_root / "proc", client.pid) is not None
        shares.end("job-7/pod-0")
        assert lib.nvmlDeviceGetMPSComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(2)) == []
        assert container_of(backend.sysfs_root / "proc", client.pid) is None
    finally:
        backend.close()
