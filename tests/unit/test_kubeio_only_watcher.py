"""Only kubeio drives a Kubernetes watch: no other product module imports ``kubernetes.watch`` or
asks the API server for a watch stream itself (its own list+watch loop).

import-linter sees external packages only by their top-level name, so this reads the sources. A
module asks for a watch by passing ``watch=`` or ``allow_watch_bookmarks=`` to a client call, or by
writing ``watch=true`` into a request path; every such call belongs in ``kubeio/listwatch.py``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("topology", "hardware", "mig", "health", "nodeagent", "deviceplugin", "scheduler_ext", "gpuweave")
WATCH_KEYWORDS = {"watch", "allow_watch_bookmarks"}


def _imports_kube_watch(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        if node.module == "kubernetes" and any(alias.name == "watch" for alias in node.names):
            return True
        return (node.module or "").startswith("kubernetes.watch")
    if isinstance(node, ast.Import):
        return any(alias.name.startswith("kubernetes.watch") for alias in node.names)
    return False


def _asks_for_a_watch(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        return any(keyword.arg in WATCH_KEYWORDS for keyword in node.keywords)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return "watch=true" in node.value.lower() or "watch=1" in node.value.lower()
    return False


def watch_drivers(source: str) -> list[str]:
    """What in ``source`` drives a watch outside kubeio: ``import`` and ``watch call`` at line N."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if _imports_kube_watch(node):
            found.append(f"import at line {getattr(node, 'lineno', '?')}")
        elif _asks_for_a_watch(node):
            found.append(f"watch call at line {getattr(node, 'lineno', '?')}")
    return found


def test_the_check_sees_each_way_of_driving_a_watch() -> None:
    assert watch_drivers("from kubernetes import watch")
    assert watch_drivers("from kubernetes import client, watch as w")
    assert watch_drivers("import kubernetes.watch")
    assert watch_drivers("from kubernetes.watch import Watch")
    assert watch_drivers("core.list_node(watch=True, resource_version=v)")
    assert watch_drivers("core.list_pod_for_all_namespaces(allow_watch_bookmarks=True)")
    assert watch_drivers("api.call_api('/api/v1/pods?watch=true', 'GET')")
    assert not watch_drivers("from kubernetes import client\ncore.list_node(field_selector='a=b')")
    assert not watch_drivers("def ListAndWatch(self, request, context): ...")  # the kubelet's gRPC API


def test_no_module_outside_kubeio_drives_a_watch() -> None:
    found = {
        f"{path.relative_to(ROOT)}: {what}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for what in watch_drivers(path.read_text())
    }
    assert not found, f"drive watches through kubeio.listwatch.ListWatch: {sorted(found)}"


def test_kubeio_holds_the_one_watch_loop() -> None:
    """The check above would pass vacuously if it could not see kubeio's own loop."""
    assert watch_drivers((ROOT / "kubeio" / "listwatch.py").read_text())
