"""Only kubeio drives the kubernetes client's watch: no other product module imports ``kubernetes.watch``.

import-linter sees external packages only by their top-level name, so this reads the sources."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("topology", "hardware", "mig", "health", "deviceplugin", "scheduler_ext", "gpuweave")
# The node agent's watches (handoff pods, MIG Node and demand) still run deviceplugin/listwatch.py's
# loop; they move onto kubeio.listwatch next. No module may join this set.
NOT_YET_MOVED = {"deviceplugin/listwatch.py"}


def _imports_kube_watch(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "kubernetes"
            and any(alias.name == "watch" for alias in node.names)
        ):
            return True
        names = [a.name for a in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else []
        module = node.module if isinstance(node, ast.ImportFrom) else None
        if module == "kubernetes.watch" or "kubernetes.watch" in names:
            return True
    return False


def test_no_module_outside_kubeio_imports_the_kubernetes_watch() -> None:
    found = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if _imports_kube_watch(path)
    }
    assert found <= NOT_YET_MOVED, f"drive watches through kubeio.listwatch.ListWatch: {sorted(found)}"
    assert all((ROOT / p).is_file() for p in NOT_YET_MOVED)
