"""The gang policy (``scheduler_ext/gangs/policy.py``): the verbs call its hooks whether gangs are
on or off, and a pod that names no gang binds past every one of them.

The count is of calls on the real cache, made through a counting proxy around it: the service,
the gang service and the snapshot binder all hold the proxy, so a gang hook that touched the
cache on a plain pod's bind (an expired reservation released, a slot taken over) would add calls.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.simulate.cluster_objects import cluster_list, pod_object
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.snapshot import SnapshotBinder, load_snapshot
from scheduler_ext.gangs.policy import NO_GANGS, GangPolicy, NoGangs
from scheduler_ext.gangs.service import GangCoordinator, GangSettings
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import ExtenderBindingArgs
from tests.unit.test_extender_gangs import TTL_S, Clock, _filter, _gang, _nodes

# what a plain pod's bind asks of the cache: the pod by UID, a holding already there (a retried
# bind), the node's lock and state, the assumed holding; then the snapshot binder's two writes
PLAIN_BIND = Counter(
    {
        "pod_object": 1,
        "holding": 1,
        "node_lock": 1,
        "node": 1,
        "assume": 1,
        "upsert_pod": 1,
        "remember_pod": 1,
    }
)


class CountedCache:
    """A real ``ClusterCache``; each method called on it from outside is counted by name."""

    def __init__(self, cache: ClusterCache) -> None:
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "calls", Counter[str]())

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._cache, name)
        if not callable(value):
            return value
        calls: Counter[str] = self.calls

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return value(*args, **kwargs)

        return counted

    def __setattr__(self, name: str, value: Any) -> None:  # hooks (on_conflict, on_pod_gone) go to the cache
        setattr(self._cache, name, value)


def _counted_extender(tmp_path: Path, settings: GangSettings) -> tuple[Extender, CountedCache]:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(_nodes())))
    cache, core = build_core(gangs=settings)
    load_snapshot(path, cache)
    counted = CountedCache(cache)
    as_cache = cast(ClusterCache, counted)
    return assemble(as_cache, core, SnapshotBinder(as_cache), gangs=settings), counted


def _bind_args(pod: dict[str, Any], node: str) -> ExtenderBindingArgs:
    meta = pod["metadata"]
    return ExtenderBindingArgs(
        PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=node
    )


@pytest.mark.parametrize("ttl_s", [0.0, TTL_S], ids=["gangs-off", "gangs-on"])
def test_a_plain_pods_bind_takes_the_same_short_path_through_the_cache_with_gangs_on_or_off(
    tmp_path: Path, ttl_s: float
) -> None:
    clock = Clock()
    extender, counted = _counted_extender(tmp_path, GangSettings(ttl_s=ttl_s, clock=clock))
    first, _ = _gang(extender, "train", size=2)
    _filter(extender.service, first)  # gangs on: both members' places held in block B
    plain = pod_object("plain", limits={RESOURCE_GPU: 8})
    passed = _filter(extender.service, plain).NodeNames
    assert passed
    clock.now += TTL_S + 1  # the gang's reservation expires before the plain pod's bind
    counted.calls.clear()
    assert extender.service.bind(_bind_args(plain, passed[0])) == ""
    assert counted.calls == PLAIN_BIND and counted.calls.total() == 7
    if extender.gangs is not None:  # the expired reservation is left to the next filter's sweep
        assert [r.key for r in extender.gangs.book.reservations()] == ["ml/gang:train"]
    extender.close()


def test_the_extender_always_holds_a_gang_policy(tmp_path: Path) -> None:
    off, _ = _counted_extender(tmp_path, GangSettings(ttl_s=0))
    on, _ = _counted_extender(tmp_path, GangSettings(ttl_s=TTL_S))
    assert isinstance(off.gang_policy, NoGangs) and off.gangs is None
    assert isinstance(on.gang_policy, GangCoordinator) and on.gang_policy is on.gangs
    off.close()
    on.close()


def test_a_service_built_without_gangs_or_with_none_holds_the_no_op_policy(tmp_path: Path) -> None:
    extender, counted = _counted_extender(tmp_path, GangSettings(ttl_s=0))
    cache = cast(ClusterCache, counted)
    binder = SnapshotBinder(cache)
    for service in (
        ExtenderService(cache=cache, core=extender.core, binder=binder),
        ExtenderService(cache=cache, core=extender.core, binder=binder, gangs=cast(GangPolicy, None)),
    ):
        assert service.gangs is NO_GANGS
    extender.close()


@pytest.mark.parametrize(
    "hook",
    [
        lambda p: p.gang_of(
            {"metadata": {"annotations": {"gpuweave.io/gang": "x", "gpuweave.io/gang-size": "?"}}}
        ),
        lambda p: p.keep_places(["a"], [True]),
        lambda p: p.take_slot("uid", "a"),
        lambda p: p.rebuild(),
    ],
)
def test_the_no_op_policy_sees_no_gang_and_changes_nothing(hook: Callable[[GangPolicy], object]) -> None:
    assert hook(NoGangs()) in (None, 0)
