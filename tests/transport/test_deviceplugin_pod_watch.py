"""The handoff's pod watch across a 410 relist (real kubernetes client, 127.0.0.1 port 0).

The watch (``deviceplugin.kube.PodWatcher`` on kubeio's ``ListWatch``) is told its resourceVersion
expired (tests/support/expiring_api.py) and lists again. Pods the new list lacks leave the view,
new ones join it after the ones already known, and a known pod keeps the resourceVersion it was
first seen bound at (the admission order the handoff ranks bursts by) while its precondition
moves on to the latest.
"""

from __future__ import annotations

from typing import Any

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from deviceplugin.handoff import PodView
from deviceplugin.kube import PodWatcher
from tests.support.expiring_api import Collection, expiring_api
from tests.support.small_inventory import gpu_uuid
from tests.support.waiting import wait_until

NODE = "node-a"


def pod(name: str, *, version: str, gpu: int, phase: str = "Pending") -> dict[str, Any]:
    assignment = PodAssignment(
        node=NODE, containers={"main": ContainerAssignment(devices={RESOURCE_GPU: [gpu_uuid(gpu)]})}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "annotations": {ANNOTATION_ASSIGNMENT: assignment.to_annotation()},
        },
        "spec": {"nodeName": NODE},
        "status": {"phase": phase},
    }


def test_a_relist_after_410_keeps_known_pods_in_place_and_drops_vanished_ones() -> None:
    first = [pod("a", version="3", gpu=0), pod("b", version="4", gpu=1)]
    second = [pod("c", version="8", gpu=2), pod("b", version="7", gpu=1, phase="Running")]
    view = PodView()
    with expiring_api() as (api, paths):
        pods = paths["/api/v1/pods"] = Collection("Pod", [("5", first), ("9", second)])
        watcher = PodWatcher(api, node=NODE, view=view)
        watcher.start()
        try:
            wait_until("the second list in the view", lambda: {p.name for p in view.assigned()} == {"b", "c"})
        finally:
            watcher.stop()
    assert watcher.watch.relists == 2 and watcher.watch.synced.is_set()
    assert {q["fieldSelector"] for q in pods.asked} == {f"spec.nodeName={NODE}"}
    b, c = sorted(view.assigned(), key=lambda p: p.seen)  # b arrived before c
    assert (b.name, b.bound, b.resource_version, b.phase) == ("b", "4", "7", "Running")
    assert (c.name, c.bound, c.created) == ("c", "8", "2025-01-01T00:00:00Z")
    assert [p.name for p in view.pending()] == ["c"]
