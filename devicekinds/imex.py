"""The IMEX channel, ``gpuweave.io/imex-channel``: channel 0 on a node of a multi-node NVLink
domain, none elsewhere. One device: the kubelet gives it to one pod at a time, so two jobs on a
node never share a channel (an IMEX channel reaches the memory every process on it exports across
the domain). kube-scheduler counts it, not the extender (``scheduled`` False); the extender only
records the job's IMEX domain for a pod that asks for it.
"""

from __future__ import annotations

from devicekinds.device import DeviceKind, PluginDevice
from devicekinds.grant import ContainerGrant, GrantContext, node_grant
from devicekinds.kind import Devices, ResourceKind
from devicemodel.contracts import IMEX_CHANNELS_ENV, RESOURCE_IMEX_CHANNEL, imex_channel_path
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan

IMEX_CHANNEL_ID = "imex-channel-0"
IMEX_CHANNEL = 0  # one IMEX domain per node at a time (its daemon serves one), so one channel


class ImexChannel(ResourceKind):
    words = (DeviceKind.IMEX,)
    resources = (RESOURCE_IMEX_CHANNEL,)
    scheduled = False

    def node_devices(self, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        fabric = inventory.nvswitch
        if fabric is None or fabric.clique is None:
            return []
        return [
            PluginDevice(
                id=IMEX_CHANNEL_ID,
                resource=RESOURCE_IMEX_CHANNEL,
                kind=DeviceKind.IMEX,
                numa_node=None,
                unit=IMEX_CHANNEL,
                device_nodes=(imex_channel_path(IMEX_CHANNEL),),
            )
        ]

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        """The channel's device node and ``NVIDIA_IMEX_CHANNELS``, which the NVIDIA Container
        Toolkit reads to make the same channel visible; no CDI name (the node goes in as a
        DeviceSpec, which every runtime honours)."""
        return node_grant(chosen, envs={IMEX_CHANNELS_ENV: ",".join(str(d.unit) for d in chosen)})
