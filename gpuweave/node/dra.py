"""The node agent's DRA mode (``gpuweave node-agent --dra``; docs/dra.md), started by the builder.

With ``--dra`` every device of the node (GPUs, MIG devices, EFA adapters) is served through Dynamic
Resource Allocation and none through the device-plugin API: the agent keeps its device model,
health and MIG manager, publishes the node's ResourceSlices (health as device taints), registers
with the kubelet's plugin watcher under ``<kubelet root>/plugins_registry`` and serves the DRA gRPC
service at ``<kubelet root>/plugins/gpuweave.io/dra.sock``. The kubelet root is ``--kubelet-root``,
by default the parent of ``--kubelet-dir`` when that is the kubelet's ``device-plugins`` directory.
DRA mode reads claims from the API server, so it needs ``--kubeconfig`` or ``--in-cluster``, and it
hands devices out as CDI devices, so it needs a CDI spec directory (``--cdi-spec-dir``). With
``--dra-mig dynamic`` the MIG manager makes the instance of an allocated MIG placement at prepare
and removes it at unprepare (``dradriver.mig_demand``); MIG demand mode, which reshapes for
device-plugin pod requests, is refused beside it. A claim that holds the node's IMEX channel and
names a GpuImexDomain joins it at prepare (``dradriver.imex_domains``); the builder runs the node's
IMEX reconciler over that (``NodeDra.imex``) instead of the pod view. A GPU the sharing
configuration makes fractional is published as one device claims share (``dradriver.shares``)
and as its units, for pods that ask ``gpuweave.io/gpu-compute`` / ``gpu-memory`` through a
DeviceClass's ``extendedResourceName`` (``dradriver.share_units``: one GPU's units open at a time,
the others tainted closed, moved after each prepare and unprepare); prepare gives each share the
MPS pipe directory and limits of the GPU's supervised daemon. On an API server that drops gated
slice fields (Kubernetes before 1.36 by default) the pool is reduced to what it keeps
(``dradriver.api_fields``, learned by the publisher from its writes).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan
from dradriver.api_fields import ServedFields, served_devices
from dradriver.claim_allocation import ClaimSource
from dradriver.claim_cdi import ClaimSpecWriter
from dradriver.devices import DRIVER, DraDevice, DraKind, MigPublishing, dra_devices
from dradriver.health_stream import HealthStream
from dradriver.imex_domains import NodeImexDomains
from dradriver.mig_demand import MigOnDemand
from dradriver.plugin import DraPluginServer
from dradriver.prepare import ClaimPreparer
from dradriver.share_units import closed_unit_taints
from dradriver.shares import ShareEdits, with_shares
from dradriver.slices import build_resource_slices
from dradriver.taint import Taint
from dradriver.taints import carry_time_added, conditions_from, device_taints
from dradriver.validate import check_slices
from gpuweave.node.cdi import host_root, spec_dir
from gpuweave.node.flags import add_dra_mig_argument
from hardware.backend import GpuBackend
from hardware.device_nodes import read_host_device_nodes
from health.service import HealthService
from mig.service import MigService
from nodeagent.agent import NodeAgent
from nodeagent.podresources import PodResourcesClient

if TYPE_CHECKING:  # the kubernetes client is imported only in DRA mode (start-up time, memory)
    from kubernetes import client

    from dradriver.kube import SlicePublisher

log = logging.getLogger(__name__)


def add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dra",
        action="store_true",
        help="serve every GPU, MIG device and EFA adapter through Dynamic Resource Allocation "
        "(ResourceSlices + the kubelet DRA plugin) and none through the device-plugin API (docs/dra.md)",
    )
    add_dra_mig_argument(parser)
    parser.add_argument(
        "--kubelet-root",
        type=Path,
        default=None,
        help="with --dra: the kubelet's root directory, holding plugins_registry/ and plugins/ "
        "(default: the parent of --kubelet-dir when that ends in device-plugins, else --kubelet-dir)",
    )


def kubelet_root(args: argparse.Namespace) -> Path:
    if args.kubelet_root is not None:
        return Path(args.kubelet_root)
    kubelet_dir = Path(args.kubelet_dir)
    return kubelet_dir.parent if kubelet_dir.name == "device-plugins" else kubelet_dir


def check_dra_arguments(args: argparse.Namespace, *, with_kube: bool) -> None:
    """Refuse a DRA command line that cannot work, in one line, before anything starts."""
    if not args.dra:
        return
    if not with_kube:
        raise GpuweaveError(
            "--dra reads ResourceClaims and publishes ResourceSlices: give --kubeconfig or --in-cluster"
        )
    if spec_dir(args) is None:
        raise GpuweaveError("--dra hands devices to containers as CDI devices: --cdi-spec-dir cannot be none")
    if args.dra_mig == MigPublishing.DYNAMIC.value and (args.mig_demand or args.mig_mode == "demand"):
        raise GpuweaveError(
            "--dra-mig dynamic makes MIG instances for allocated claims; --mig-mode demand would reshape "
            "for nvidia.com/mig-* pod requests on the same GPUs: use --mig-mode off or declared"
        )


class ClaimingSource:
    """The claims prepare reads, each told to active checks first, as Allocate tells them
    (``NodeAgent.claim_hook``): the GPUs a claim was allocated here (MIG devices aside) are recorded
    as granted, then a check running on one lets go of it before the claim is prepared
    (``health.active_claims``)."""

    def __init__(
        self,
        source: ClaimSource,
        *,
        pool: str,
        devices: Callable[[], tuple[NodeInventory, Sequence[DraDevice]]],
        agent: NodeAgent,
    ) -> None:
        self._source, self._pool, self._devices, self._agent = source, pool, devices, agent

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        claim = self._source.get_claim(namespace, name)
        allocation = (claim.get("status") or {}).get("allocation")
        devices = (allocation.get("devices") or {}) if isinstance(allocation, Mapping) else {}
        results = devices.get("results") or []
        names = {
            str(r.get("device", ""))
            for r in results
            if isinstance(r, Mapping) and r.get("driver") == DRIVER and r.get("pool") == self._pool
        }
        _, published = self._devices()
        # a MIG placement names its parent GPU, which a check never exercises (MIG mode) and which
        # the MIG manager must not see as held by a pod while it makes the instance
        gpus = frozenset(
            d.gpu_uuid for d in published if d.name in names and d.gpu_uuid and d.kind is not DraKind.MIG
        )
        if gpus:
            self._agent.allocations.record(gpus)
            hook = self._agent.claim_hook
            if hook is not None:
                hook(gpus)
        return claim


@dataclass
class NodeDra:
    server: DraPluginServer
    publisher: SlicePublisher
    imex: NodeImexDomains  # the GpuImexDomain the node's IMEX channel joined: the IMEX reconciler's source
    preparer: ClaimPreparer  # its prepared claims' shares: the per-pod memory check's limits

    def stop(self) -> None:
        self.publisher.stop()
        self.server.stop()
        self.imex.stop()


def _node_owner(api: client.ApiClient, node: str) -> dict[str, Any] | None:
    """An ownerReference to the Node, so its slices go with it (None when it cannot be read)."""
    from kubernetes import client  # noqa: PLC0415 (deferred: DRA mode only)

    try:
        uid = client.CoreV1Api(api).read_node(node).metadata.uid  # type: ignore[union-attr]
    except Exception as exc:
        log.warning("cannot read Node %s (%s): its ResourceSlices get no owner reference", node, exc)
        return None
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}


@dataclass
class NodeDraStarter:
    """DRA mode for a started agent: the pool's devices (built again only for a new inventory or
    sharing plan), the claim preparer, the slice publisher with health as device taints, the health
    stream and the kubelet plugin; ``start`` starts them and returns them as a ``NodeDra``."""

    args: argparse.Namespace
    agent: NodeAgent
    backend: GpuBackend
    api: client.ApiClient
    health: HealthService | None
    node: str
    mig_service: MigService | None = None
    pod_resources: PodResourcesClient | None = None
    _built: list[tuple[NodeInventory, SharingPlan, tuple[DraDevice, ...]]] = field(
        default_factory=list, init=False
    )
    _owner: dict[str, Any] | None = field(default=None, init=False)
    # what the API server keeps of a slice, learned by the publisher from its writes
    _served: ServedFields = field(default_factory=ServedFields, init=False)

    def devices(self) -> tuple[NodeInventory, tuple[DraDevice, ...]]:
        """The pool's devices, built again only when the inventory or the sharing plan is a new
        object (a fractional GPU's units make a pool of ~1,400 devices on 8 GPUs: ~0.1 s to build,
        and the pod-resources resolver asks once per claim device)."""
        inventory, plan = self.agent.inventory, self.agent.config.sharing
        built = self._built
        if not built or built[0][0] is not inventory or built[0][1] is not plan:
            mig = MigPublishing(self.args.dra_mig)
            built[:] = [(inventory, plan, with_shares(dra_devices(inventory, mig=mig), inventory, plan))]
        return inventory, built[0][2]

    def clique(self) -> str | None:
        fabric = self.agent.inventory.nvswitch
        return fabric.clique if fabric is not None else None

    def preparer(self, imex: NodeImexDomains) -> ClaimPreparer:
        from dradriver.kube import KubeClaimSource  # noqa: PLC0415 (deferred: DRA mode only)

        agent, mig_service = self.agent, self.mig_service
        directory = spec_dir(self.args)
        if directory is None:  # refused by check_dra_arguments already
            raise GpuweaveError("--dra needs a CDI spec directory")
        on_demand = (
            MigOnDemand(mig_service.reconciler, refresh=agent.refresh_inventory)
            if MigPublishing(self.args.dra_mig) is MigPublishing.DYNAMIC and mig_service is not None
            else None
        )
        source = ClaimingSource(KubeClaimSource(self.api), pool=self.node, devices=self.devices, agent=agent)
        return ClaimPreparer(
            pool=self.node,
            state_dir=self.args.state_dir,
            source=source,
            devices=self.devices,
            specs=ClaimSpecWriter(directory),
            host=partial(read_host_device_nodes, host_root(self.backend)),
            mig=on_demand,
            imex=imex,
            share_edits=ShareEdits(
                sharing=lambda: (agent.inventory, agent.config.sharing), pipes=lambda: agent.mps_pipes
            ),
        )

    def taints_now(self) -> tuple[NodeInventory, tuple[DraDevice, ...], dict[str, tuple[Taint, ...]]]:
        inventory, pool = self.devices()
        faults, withheld = self.agent.health_maps()
        snapshot = self.health.snapshot() if self.health else None
        conditions = conditions_from(snapshot, faults=faults, withheld=withheld)
        return inventory, pool, device_taints(pool, conditions)

    def slices(
        self, preparer: ClaimPreparer, generation: int, published: Mapping[str, list[Mapping[str, str]]]
    ) -> list[dict[str, Any]]:
        """The pool's ResourceSlices: health taints, the share units' closed taints, checked."""
        inventory, pool, taints = self.taints_now()
        held = {d.device_name for prepared in preparer.prepared().values() for d in prepared}
        closed = closed_unit_taints(pool, held=held, tainted=set(taints))
        taints = {name: (*taints.get(name, ()), *closed.get(name, ())) for name in {*taints, *closed}}
        served_pool, served_taints = served_devices(pool, taints, self._served.unsupported)
        kept = carry_time_added(served_taints, published)
        slices = build_resource_slices(
            inventory, served_pool, generation=generation, taints=kept, owner=self._owner
        )
        check_slices(slices)
        return slices

    def report(self) -> list[tuple[str, bool, str]]:
        _, pool, taints = self.taints_now()
        return [
            (
                d.name,
                d.name not in taints,
                "; ".join(f"{t.key}={t.value} ({t.effect})" for t in taints.get(d.name, ())),
            )
            for d in pool
        ]

    def device_id(self, driver: str, pool_name: str, name: str) -> str | None:
        """A DRA device the kubelet lists for a pod, as the device ID health and MIG know."""
        if driver != DRIVER or pool_name != self.node:
            return None
        found = next((d for d in self.devices()[1] if d.name == name), None)
        if found is None:
            return None
        return found.plugin.id if found.plugin is not None else found.gpu_uuid

    def start(self) -> NodeDra:
        """Start the DRA plugin and the slice publisher."""
        from dradriver.kube import KubeImexDomains, SlicePublisher  # noqa: PLC0415 (DRA mode only)

        imex = NodeImexDomains(node=self.node, api=KubeImexDomains(self.api), clique=self.clique)
        preparer = self.preparer(imex)
        self._owner = _node_owner(self.api, self.node)
        if self.pod_resources is not None:
            self.pod_resources.resolve_dra_with(self.device_id)
        stream = HealthStream(self.report, pool=self.node)
        publisher = SlicePublisher(
            self.api, node=self.node, build=partial(self.slices, preparer), served=self._served
        )
        preparer.listeners.append(publisher.changed)  # the open GPU of share units follows the claims
        server = DraPluginServer(
            preparer, kubelet_root=kubelet_root(self.args), health=stream, on_registered=publisher.resync
        )
        server.start()
        for changed in (publisher.changed, stream.changed):
            self.agent.add_listener(changed)
            if self.health is not None:
                self.health.add_listener(lambda _snapshot, changed=changed: changed())  # type: ignore[misc]
        publisher.start()
        log.warning(
            "node agent in DRA mode: driver gpuweave.io, pool %s, plugin %s", self.node, server.socket_path
        )
        return NodeDra(server, publisher, imex, preparer)
