"""The resource-kind registry: one kind per name, every built-in name found, a clash refused, and
the node's catalogue made only by the kinds of the registry it is given."""

from __future__ import annotations

import pytest

from devicekinds.efa import EfaAdapter
from devicekinds.registry import KINDS, KindRegistry
from devicemodel.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    RESOURCE_IMEX_CHANNEL,
    mig_resource_name,
)
from devicemodel.errors import InvalidInputError
from devicemodel.sharing import SharingPlan
from gpuweave.simulate.cluster_objects import profile_inventory
from nodeagent.devices import build_catalogue
from tests.support.widget_kind import RESOURCE_WIDGET, TestWidget


def test_every_built_in_name_has_one_kind() -> None:
    names = {
        RESOURCE_GPU: "WholeGpu",
        mig_resource_name("1g.10gb+me"): "MigDevice",
        RESOURCE_GPU_COMPUTE: "FractionalShare",
        RESOURCE_GPU_MEMORY: "FractionalShare",
        RESOURCE_GPU_SHARED: "TimeSlicedReplica",
        RESOURCE_EFA: "EfaAdapter",
        RESOURCE_IMEX_CHANNEL: "ImexChannel",
    }
    for name, kind in names.items():
        found = KINDS.kind_for(name)
        assert found is not None and type(found).__name__ == kind, name
        assert sum(1 for k in KINDS if k.owns(name)) == 1
    assert KINDS.kind_for("nvidia.com/gpu-other") is None and KINDS.kind_for("cpu") is None
    assert KINDS.names_under("gpuweave.io/") == {
        RESOURCE_GPU_COMPUTE,
        RESOURCE_GPU_MEMORY,
        RESOURCE_GPU_SHARED,
        RESOURCE_IMEX_CHANNEL,
    }
    assert KINDS.planned_generically() == ()  # every built-in kind has its planner in the extender


def test_a_kind_claiming_a_served_name_is_refused() -> None:
    registry = KindRegistry((EfaAdapter(),))
    with pytest.raises(InvalidInputError, match="already served by EfaAdapter"):
        registry.register(EfaAdapter())
    registry.register(TestWidget())
    assert registry.kind_for(RESOURCE_WIDGET) is not None


def test_the_catalogue_is_made_by_the_registry_it_is_given() -> None:
    inventory = profile_inventory("p5.48xlarge", "n0")
    plain = build_catalogue(inventory, SharingPlan())
    assert RESOURCE_WIDGET not in plain and len(plain[RESOURCE_EFA]) == 32
    registry = KindRegistry((*KINDS, TestWidget()))
    with_widgets = build_catalogue(inventory, SharingPlan(), kinds=registry)
    assert len(with_widgets[RESOURCE_WIDGET]) == 32
    assert {r: d for r, d in with_widgets.items() if r != RESOURCE_WIDGET} == plain
    assert list(with_widgets)[: len(plain)] == list(plain)  # the built-in resources keep their order
