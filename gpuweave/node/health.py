"""Health for the node agent: builds ``HealthService`` from the agent, the backend and the API.

Called through ``gpuweave.node.builder.NodeAgentBuilder.health`` once the agent has started. On a GPU
host the probe reads NVML through the backend's library and ``/sys``, the kernel log is
``/dev/kmsg`` and resets run ``nvidia-smi -r``. With a simulated backend the probe reads the
simulated NVML library and sysfs tree, the kernel log is ``STATE_DIR/kmsg`` (the simulated driver
writes its Xid lines there), resets follow the simulated node's rules and the agent's control
socket gets the ``sim.inject`` command. Active checks (``gpuweave.node.active``) get their exerciser,
the agent's gate to hold the GPUs under a check, and the ``health.check`` commands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devicemodel.errors import GpuweaveError
from gpuweave.node.active import HeldByPods, busy_for, exerciser_for, hold_for, register_check_routes
from hardware.backend import GpuBackend
from hardware.gpu_reset import GpuInUseError, nvidia_smi_reset
from hardware.health_probe import NvmlHealthProbe
from hardware.nvml import NvmlBackend
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.health_inject import inject_route
from health.config import HealthSettings, load_health_settings
from health.engine import Clock
from health.metrics import HealthMetrics
from health.remediation import DeviceOps, MigRecreate, PodDeviceLookup
from health.service import HealthParts, HealthService
from health.signals.protocol import HealthSignal
from mig.owners import GpuOwners
from mig.planner import MigPlanError
from mig.service import MigService
from nodeagent.agent import NodeAgent
from nodeagent.metrics import AgentMetrics
from nodeagent.podresources import HeldDevices

if TYPE_CHECKING:
    from health.kube import KubeCluster

log = logging.getLogger(__name__)
SIM_KMSG_FILE = "kmsg"
SIM_INJECT_METHOD = "sim.inject"
HOST_KMSG = "/dev/kmsg"


def load_settings(path: Path | None) -> HealthSettings:
    """Health settings from a YAML file (its ``health:`` section, or the whole file); defaults without one."""
    if path is None:
        return HealthSettings()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise GpuweaveError(f"cannot read health config {path}: {exc}") from exc
    section = data.get("health", data) if isinstance(data, dict) else data
    return load_health_settings(section)


def start_node_health(
    agent: NodeAgent,
    *,
    backend: GpuBackend,
    state_dir: Path,
    node_name: str,
    settings: HealthSettings,
    kube_api: Any | None = None,
    metrics: AgentMetrics | None = None,
    recreate_mig: MigRecreate | None = None,
    pod_devices: PodDeviceLookup | None = None,
    gpu_owners: GpuOwners | None = None,
    signals: tuple[HealthSignal, ...] = (),
    kill_mps: Callable[[int], str] | None = None,
    taints_evict: bool = False,
    held_by_pods: HeldByPods | None = None,
    clock: Clock = time.monotonic,
    pods_known: bool = False,
) -> HealthService:
    """Build, wire and start health for a started agent; returns the service (stop it before the agent).

    ``pod_devices`` (the kubelet's pod-resources API, e.g. ``PodResourcesClient.pod_devices``)
    joins the extender's assignment annotations when finding the pods on a failed device.
    ``gpu_owners`` (the MIG reconciler's ``owners``) makes each GPU reset own its GPU, so a
    reset never runs inside a MIG reshape of that GPU. ``signals`` are read each round after the
    built-in ones (MPS daemon supervision); ``kill_mps`` lets ``sim.inject`` kill a GPU's MPS daemon.
    ``taints_evict`` (DRA mode) leaves the eviction of a failed device's pods to the device-taint
    eviction controller. ``held_by_pods`` names the devices pods hold (``HeldDevices``), which active
    checks leave alone; by default the agent's recent Allocate grants. ``pods_known``: it names every
    device pods hold (the kubelet's pod-resources API answers it), so idle GPUs can be checked
    between jobs; recent grants alone cannot tell a GPU a pod still holds from an idle one.
    ``clock`` times health (fault windows, remediation, probation): the simulation passes its
    simulated clock."""
    held = held_by_pods or HeldDevices(None, agent.allocations)
    probe = probe_for(backend)
    kernel_log = state_dir / SIM_KMSG_FILE if isinstance(backend, SimulatedBackend) else Path(HOST_KMSG)
    service = HealthService(
        HealthParts(
            inventory=agent.inventory,
            probe=probe,
            device_ops=probe if gpu_owners is None else OwnedResets(probe, gpu_owners),
            sink=agent,
            state_dir=state_dir,
            settings=settings,
            node_name=node_name,
            kernel_log=kernel_log,
            cluster=_cluster(kube_api, node_name=node_name),
            metrics=HealthMetrics(metrics.registry) if metrics is not None else None,
            recreate_mig=recreate_mig,
            pod_devices=pod_devices,
            signals=signals,
            taints_evict=taints_evict,
            exerciser=exerciser_for(backend, settings.active),
            hold=hold_for(agent),
            busy=busy_for(held),
            held=held if pods_known else None,
            clock=clock,
            links=agent.set_degraded_links,
        )
    )
    if isinstance(backend, SimulatedBackend):
        node = backend.node
        inject = inject_route(node.health, mig=node.mig, kill_mps=kill_mps, exerciser=node.exerciser)
        agent.control.add_route(SIM_INJECT_METHOD, inject)
    if service.active is not None:
        register_check_routes(agent, service.active)
        agent.claim_hook = service.active.claims.claim  # a pod granted a GPU mid-check wins
        if kube_api is not None:
            _serve_preflights(service, kube_api, node_name=node_name, agent=agent)
    agent.control.add_route("health.status", lambda _params: status(service))
    agent.add_listener(lambda: _follow_inventory(service, agent))
    modes = _mig_modes(agent)
    agent.add_listener(lambda: _renew_events_on_mode_change(probe, agent, modes))
    service.start()
    return service


def probe_for(backend: GpuBackend) -> NvmlHealthProbe:
    """Health reads over the backend: the simulated NVML and sysfs tree, or the host's NVML and /sys."""
    if isinstance(backend, SimulatedBackend):
        sim, root = backend.node.health, backend.sysfs_root
        return NvmlHealthProbe(
            backend.lib, sysfs_root=root / "sys", reset=sim.reset_uuid, proc_root=root / "proc"
        )
    if isinstance(backend, NvmlBackend):
        return NvmlHealthProbe(backend.lib, sysfs_root=Path("/sys"), reset=nvidia_smi_reset)
    raise GpuweaveError(f"no health probe for a {type(backend).__name__} backend")


def _cluster(kube_api: Any | None, *, node_name: str) -> KubeCluster | None:
    """The API-server side of health, imported only with an API: --no-kube runs load no kubernetes client."""
    if kube_api is None:
        return None
    from health.kube import KubeCluster  # noqa: PLC0415 (deferred: ~13 MB and ~0.2 s of imports)

    return KubeCluster(kube_api, node_name=node_name)


def _serve_preflights(service: HealthService, kube_api: Any, *, node_name: str, agent: NodeAgent) -> None:
    """Gang preflights asked of this node (``GpuPreflight`` objects), run by its active checks;
    started with health, stopped with it. Imported only with an API, as ``_cluster``."""
    from health.preflight_kube import PreflightServer  # noqa: PLC0415 (deferred: the kubernetes client)

    assert service.active is not None
    server = PreflightServer(
        kube_api, node=node_name, runner=service.active, inventory=lambda: agent.inventory
    )
    service.stoppers.append(server.stop)
    server.start()


def mig_recreator(mig: MigService, agent: NodeAgent) -> MigRecreate:
    """Recreate one failed MIG device through the MIG manager (``MigReconciler.recreate``).

    The reconciler owns the GPU from its check to the end and puts back the layout NVML shows
    then, so a reshape the operator ran after the fault stands; a device that reshape destroyed
    is not recreated (False). A busy instance is "in use": remediation waits and tries again.
    """

    def recreate(gpu_uuid: str, mig_uuid: str) -> bool:
        index = agent.inventory.gpu_by_uuid(gpu_uuid).index
        try:
            return mig.reconciler.recreate(index, mig_uuid) is not None
        except MigPlanError as exc:
            raise GpuInUseError(
                f"MIG device {mig_uuid} on GPU {index} cannot be recreated yet: {exc}"
            ) from exc

    return recreate


class OwnedResets:
    """Device operations whose GPU reset owns the GPU (``GpuOwners``) while it runs."""

    def __init__(self, ops: DeviceOps, owners: GpuOwners) -> None:
        self._ops = ops
        self._owners = owners

    def gpu_busy(self, uuid: str) -> bool:
        return self._ops.gpu_busy(uuid)

    def reset_gpu(self, uuid: str) -> None:
        with self._owners.hold(uuid, who="health: GPU reset"):
            self._ops.reset_gpu(uuid)


def _mig_modes(agent: NodeAgent) -> dict[str, bool]:
    return {g.uuid: g.mig_enabled for g in agent.inventory.gpus}


def _renew_events_on_mode_change(probe: NvmlHealthProbe, agent: NodeAgent, modes: dict[str, bool]) -> None:
    """Register NVML events afresh when a GPU's MIG mode changed (its registrations went with it)."""
    now = _mig_modes(agent)
    if now != modes:
        modes.clear()
        modes.update(now)
        failed = probe.renew_events()
        if failed:
            log.warning("NVML events not renewed after a MIG mode change on %s", ", ".join(failed))


def _follow_inventory(service: HealthService, agent: NodeAgent) -> None:
    """Track MIG devices created or destroyed by a reshape (only when the set changed)."""
    inventory = agent.inventory
    if set(inventory.mig_devices) != set(service.engine.inventory.mig_devices):
        service.update_inventory(inventory)


def status(service: HealthService) -> dict[str, Any]:
    """Per-device health for tools and tests (``health.status`` on the control socket)."""
    snap = service.snapshot()

    def row(record: Any) -> dict[str, Any]:
        return {
            "state": str(record.state),
            "reason": record.reason,
            "strikes": record.strikes,
            "lastXid": record.last_xid,
        }

    return {
        "gpus": {uuid: row(r) for uuid, r in snap.gpus.items()},
        "migs": {uuid: row(r) for uuid, r in snap.migs.items()},
        "efa": dict(snap.efa_up),
        "nodeFaults": sorted(f"{f.kind}:{f.subject}" for f in snap.node_faults),
        "startupPending": snap.startup_pending,
        "rounds": service.monitor.rounds_completed,
        "badHardware": sorted(service.badlist.entries()),
        "degradedLinks": sorted([*record.gpus, record.reason] for record in service.links.values()),
        "unsavedState": service.state.unsaved(),
        "activeChecks": _active_status(service),
    }


def _active_status(service: HealthService) -> dict[str, Any] | None:
    if service.active is None:
        return None
    idle = service.idle.status() if service.idle is not None else None
    return {**service.active.status(), "betweenJobs": idle}
