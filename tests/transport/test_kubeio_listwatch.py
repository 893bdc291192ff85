"""kubeio's list+watch against the real kube-apiserver (tests/e2e/harness): a watch that times out
resumes without listing again, bookmarks move the resourceVersion on, a ConfigMap deleted while
the loop could not reach the server comes out as a synthesised DELETED after the 410 relist, and
``stop`` ends a watch that is waiting for events at once, not at its timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from kubeio.listwatch import ListWatch
from tests.support.control_plane import ControlPlane
from tests.support.waiting import poll_until, wait_until

pytestmark = pytest.mark.e2e
LABEL = "lw=test"


class Cuttable:
    """A kubernetes list function whose network the test can cut: calls fail as refused connections."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.cut = False
        self.refused = 0

    def __call__(self, **kwargs: Any) -> Any:
        if self.cut:
            self.refused += 1
            raise ConnectionRefusedError("connection refused (network cut by the test)")
        return self._core.list_namespaced_config_map("default", **kwargs)


class Seen:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((kind, obj["metadata"]["name"]))

    def has(self, kind: str, name: str) -> bool:
        with self._lock:
            return (kind, name) in self.events


def _plane(tmp: Path, flags: list[str]) -> Iterator[Any]:
    plane = ControlPlane(tmp, extra_args=flags)
    api = config.new_client_from_config(config_file=str(plane.admin_kubeconfig))
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()
        plane.stop()


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _plane(tmp_path_factory.mktemp("plane"), [])


@pytest.fixture
def compacting_core(tmp_path: Path) -> Iterator[Any]:
    """Watches read etcd directly and etcd compacts every second: an old resourceVersion gets 410."""
    yield from _plane(
        tmp_path, ["--apiserver-arg=--watch-cache=false", "--apiserver-arg=--etcd-compaction-interval=1s"]
    )


def _configmap(core: Any, name: str, *, labelled: bool = True) -> None:
    labels = {"lw": "test"} if labelled else {}
    core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": labels}})


def test_watch_timeouts_resume_without_a_relist_and_bookmarks_move_the_version(core: Any) -> None:
    _configmap(core, "first")
    seen = Seen()
    loop = ListWatch(Cuttable(core), on_event=seen, what="configmaps", timeout_s=3, label_selector=LABEL)
    loop.start()
    try:
        wait_until("first sync", loop.synced.is_set)
        assert seen.has("ADDED", "first")
        wait_until("three watch requests (two timed out)", lambda: loop.watches >= 3, timeout=60)
        _configmap(core, "second")
        wait_until("the resumed watch delivers the new object", lambda: seen.has("ADDED", "second"))
        assert loop.relists == 1
        listed = int(loop.resource_version)
        for i in range(5):  # progress the bookmarks report: objects this watch does not select
            _configmap(core, f"other-{i}", labelled=False)
        wait_until("a bookmark", lambda: loop.bookmarks >= 1, timeout=60)
        assert poll_until(lambda: int(loop.resource_version) > listed, timeout=60)
        assert all(name not in ("other-0",) for _, name in seen.events)
    finally:
        loop.stop()


def test_an_object_deleted_while_disconnected_is_deleted_after_the_410_relist(compacting_core: Any) -> None:
    core = compacting_core
    _configmap(core, "keep")
    _configmap(core, "gone")
    seen = Seen()
    network = Cuttable(core)
    loop = ListWatch(network, on_event=seen, what="configmaps", timeout_s=1, label_selector=LABEL)
    loop.start()
    try:
        wait_until("first sync", loop.synced.is_set)
        network.cut = True
        wait_until("the loop to find the network cut", lambda: network.refused >= 1, timeout=30)
        version = loop.resource_version
        core.delete_namespaced_config_map("gone", "default")
        for i in range(20):  # move etcd's revision on, so the compaction passes the loop's version
            _configmap(core, f"churn-{i}", labelled=False)

        def compacted() -> bool:
            try:
                core.list_namespaced_config_map(
                    "default", resource_version=version, resource_version_match="Exact"
                )
            except client.ApiException as exc:
                return exc.status == 410
            return False

        wait_until("etcd to compact past the loop's version", compacted, timeout=60)
        assert not seen.has("DELETED", "gone")
        network.cut = False
        wait_until("the 410 relist", lambda: loop.relists >= 2, timeout=60)
        assert seen.has("DELETED", "gone") and not seen.has("DELETED", "keep")
    finally:
        loop.stop()


def test_stop_ends_a_waiting_watch_at_once(core: Any) -> None:
    """The node agent stops three watches on SIGTERM within its grace period, so none may wait for
    the server to end its watch request (its timeout) or to send an event."""
    loop = ListWatch(Cuttable(core), on_event=Seen(), what="configmaps", timeout_s=30, label_selector=LABEL)
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    wait_until("the watch request open", lambda: loop.watches >= 1)
    time.sleep(1)  # the reader is now waiting on the socket: nothing this watch selects changes
    stopping = threading.Thread(target=loop.stop, daemon=True)
    stopping.start()
    stopping.join(timeout=5)
    runner.join(timeout=5)
    assert not stopping.is_alive() and not runner.is_alive(), "stop waited for the watch to end"
