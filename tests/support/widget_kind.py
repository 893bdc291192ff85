"""A resource kind that exists only in the tests: ``gpuweave.io/test-widget``, one whole device per
NIC of the node's profile. One module and one ``KINDS.register`` call, nothing else: it shows that
the extender and the node agent serve a kind they were never written for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from devicekinds.device import PluginDevice, numa_of
from devicekinds.grant import ANNOTATION_DEVICES, ContainerGrant, GrantContext
from devicekinds.kind import Devices, ResourceKind
from devicekinds.registry import KINDS
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan

RESOURCE_WIDGET = "gpuweave.io/test-widget"
WIDGETS_ENV = "GPUWEAVE_TEST_WIDGETS"


class TestWidget(ResourceKind):
    __test__ = False  # not a test class, whatever pytest makes of its name

    words = ("widget",)
    resources = (RESOURCE_WIDGET,)

    def node_devices(self, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        return [
            PluginDevice(
                id=f"widget-{nic.name}",
                resource=RESOURCE_WIDGET,
                kind="widget",
                numa_node=numa_of(nic.numa_node),
                pcie_switch=nic.pcie_switch,
            )
            for nic in inventory.nics
        ]

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        ids = ",".join(d.id for d in chosen)
        return ContainerGrant(envs={WIDGETS_ENV: ids}, annotations={ANNOTATION_DEVICES: ids})


@contextlib.contextmanager
def registered_widget() -> Iterator[TestWidget]:
    """The widget kind in the process-wide registry for the block's length (its one registry line)."""
    kind = TestWidget()
    KINDS.register(kind)
    try:
        yield kind
    finally:
        KINDS.unregister(kind)
