"""``gpuweave node-agent --cleanup`` and ``gpuweave uninstall``: what is removed from a Node and from
the host, and what is kept (other owners' labels, taints, cordons, files; the bad-hardware list)."""

from __future__ import annotations

import copy
import socket
from pathlib import Path
from typing import Any

import pytest

from gpuweave.cli import main
from gpuweave.node.cleanup import (
    HostPlaces,
    conditions_patch,
    host_paths,
    leftovers,
    marked_by_gpuweave,
    node_patch,
)
from gpuweave.node.cleanup_run import refuse_if_agent_runs, remove_host_state
from gpuweave.node.uninstall import UNINSTALL_ANNOTATION, cleaned_nodes, cleanup_daemonset, rollout

OTHER_TAINT = {
    "key": "example.com/maintenance",
    "value": "x",
    "effect": "NoExecute",
    "timeAdded": "2026-01-01T00:00:00Z",
}


def _node(*, annotations: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n0",
            "resourceVersion": "42",
            "labels": {
                "kubernetes.io/hostname": "n0",
                "nvidia.com/gpu.present": "true",  # the GPU operator's, not the agent's
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.clique": "domain-a.1",  # stale: the agent's, from an earlier fabric
                "gpuweave.io/topology": "nvswitch-8",
                "nvidia.com/cuda.driver.major": "550",
                "gpuweave.io/sharing-config": "small",  # the operator's choice of configuration
            },
            "annotations": {"gpuweave.io/mig-layout": "{}", **(annotations or {})},
        },
        "spec": {
            "unschedulable": unschedulable,
            "taints": [
                OTHER_TAINT,
                {"key": "gpuweave.io/node-fault", "value": "nvlink", "effect": "NoSchedule"},
                {"key": "gpuweave.io/health-pending", "effect": "NoSchedule"},
            ],
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "GpuweaveGpuHealthy", "status": "False"},
                {"type": "GpuweaveHealthStateSaved", "status": "True"},
            ]
        },
    }


def test_the_patch_removes_exactly_the_agents_labels_taints_annotation_and_cordon() -> None:
    patch = node_patch(_node(annotations={"gpuweave.io/cordoned-by-health": "true"}, unschedulable=True))
    assert patch == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {
                "gpuweave.io/topology": None,
                "nvidia.com/cuda.driver.major": None,
                "nvidia.com/gpu.clique": None,
                "nvidia.com/gpu.count": None,
            },
            "annotations": {"gpuweave.io/cordoned-by-health": None},
        },
        "spec": {"taints": [OTHER_TAINT], "unschedulable": False},
    }


def test_a_cordon_the_agent_did_not_make_stays() -> None:
    patch = node_patch(_node(unschedulable=True))
    assert patch is not None and "unschedulable" not in patch["spec"]


def test_a_clean_node_needs_no_patch_and_shows_nothing() -> None:
    node = _node()
    node["metadata"]["labels"] = {"kubernetes.io/hostname": "n0", "nvidia.com/gpu.present": "true"}
    node["spec"]["taints"] = [OTHER_TAINT]
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert node_patch(node) is None and conditions_patch(node) is None
    assert not leftovers(node) and leftovers(node).describe() == "nothing"


def test_the_status_patch_deletes_only_the_agents_conditions() -> None:
    assert conditions_patch(_node()) == {
        "status": {
            "conditions": [
                {"type": "GpuweaveGpuHealthy", "$patch": "delete"},
                {"type": "GpuweaveHealthStateSaved", "$patch": "delete"},
            ]
        }
    }


def _host(tmp_path: Path) -> HostPlaces:
    root = tmp_path / "kubelet"
    state, plugins, cdi = tmp_path / "state", root / "device-plugins", tmp_path / "cdi"
    for directory in (state / "mps" / "GPU-1", state / "cdi", plugins, root / "plugins" / "gpuweave.io", cdi):
        directory.mkdir(parents=True)
    (root / "plugins" / "other.example.com").mkdir()
    (root / "plugins_registry").mkdir()
    for name in (
        "agent.json",
        "mig-journal.json",
        "bad-hardware.json",
        "health-strikes.json",
        "dra-claims.json",
    ):
        (state / name).write_text("{}")
    for name in ("gpuweave-gpu.sock", "gpuweave-mig-1g.10gb.sock", "kubelet.sock", "nvidia-gpu.sock"):
        (plugins / name).touch()
    for name in ("gpuweave.io-reg.sock", "other.example.com-reg.sock"):
        (root / "plugins_registry" / name).touch()
    for name in (
        "gpuweave-nvidia.com-gpu.json",
        "gpuweave.io-claim_1234.json",
        "nvidia.yaml",
        "gpuweave-notes.txt",
    ):
        (cdi / name).write_text("{}")
    return HostPlaces(state_dir=state, kubelet_dir=plugins, cdi_spec_dir=cdi)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_host_cleanup_removes_the_agents_files_and_keeps_others_and_the_bad_hardware_list(
    tmp_path: Path,
) -> None:
    places = _host(tmp_path)
    remove_host_state(places)
    assert _tree(tmp_path) == {
        "state",
        "state/bad-hardware.json",
        "state/health-strikes.json",
        "kubelet",
        "kubelet/device-plugins",
        "kubelet/device-plugins/kubelet.sock",
        "kubelet/device-plugins/nvidia-gpu.sock",
        "kubelet/plugins",
        "kubelet/plugins/other.example.com",
        "kubelet/plugins_registry",
        "kubelet/plugins_registry/other.example.com-reg.sock",
        "cdi",
        "cdi/nvidia.yaml",
        "cdi/gpuweave-notes.txt",
    }
    remove_host_state(places)  # a second run finds nothing more
    assert "state/bad-hardware.json" in _tree(tmp_path)


def test_asked_to_the_bad_hardware_list_goes_too_and_the_state_dir_with_it(tmp_path: Path) -> None:
    places = _host(tmp_path)
    removed = remove_host_state(HostPlaces(**{**places.__dict__, "keep_bad_hardware": False}))
    assert not places.state_dir.exists() and places.state_dir in removed


def test_a_spec_dir_inside_the_state_dir_goes_with_it_and_absent_dirs_are_no_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    listings = {state: ["cdi", "agent.json"], state / "cdi": ["gpuweave-nvidia.com-gpu.json"]}
    places = HostPlaces(
        state_dir=state, kubelet_dir=tmp_path / "absent" / "device-plugins", cdi_spec_dir=state / "cdi"
    )
    assert host_paths(places, listings) == [state / "agent.json", state / "cdi"]
    assert remove_host_state(places) == []


def test_cleanup_refuses_while_an_agent_answers_on_its_control_socket(tmp_path: Path) -> None:
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(tmp_path / "agent.sock"))
    listening.listen(1)
    try:
        with pytest.raises(Exception, match="a node agent is running"):
            refuse_if_agent_runs(tmp_path)
    finally:
        listening.close()
    refuse_if_agent_runs(tmp_path)  # a socket nobody answers on: left by a stopped agent


def test_node_agent_cleanup_without_api_server_cleans_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    places = _host(tmp_path)
    argv = ["node-agent", "--cleanup", "--no-kube", "--node-name", "n0", "--state-dir", str(places.state_dir)]
    argv += ["--kubelet-dir", str(places.kubelet_dir), "--cdi-spec-dir", str(places.cdi_spec_dir)]
    assert main(argv) == 0
    assert not (places.kubelet_dir / "gpuweave-gpu.sock").exists()
    assert not (places.cdi_spec_dir / "gpuweave-nvidia.com-gpu.json").exists()
    assert "kept the bad-hardware list" in capsys.readouterr().out
    assert main(["node-agent", "--then-wait", "--no-kube"]) == 2


DAEMONSET: dict[str, Any] = {
    "metadata": {"name": "gpuweave-node-agent", "generation": 3},
    "spec": {
        "selector": {"matchLabels": {"app.kubernetes.io/name": "gpuweave-node-agent"}},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "gpuweave-node-agent"}},
            "spec": {
                "containers": [
                    {
                        "name": "node-agent",
                        "image": "ghcr.io/gpuweave/gpuweave:0.1.0",
                        "args": ["node-agent", "--state-dir=/var/run/gpuweave", "--in-cluster"],
                        "ports": [{"name": "metrics", "containerPort": 9402}],
                        "volumeMounts": [{"name": "state", "mountPath": "/var/run/gpuweave"}],
                    }
                ]
            },
        },
    },
    "status": {"desiredNumberScheduled": 2},
}


def test_the_uninstall_daemonset_cleans_in_an_init_container_with_the_agents_flags_and_mounts() -> None:
    new = cleanup_daemonset(DAEMONSET)
    template = new["spec"]["template"]
    (init,) = template["spec"]["initContainers"]
    (wait,) = template["spec"]["containers"]
    agent_args = ["node-agent", "--state-dir=/var/run/gpuweave", "--in-cluster"]
    assert init["args"] == [*agent_args, "--cleanup"] and init["name"] == "cleanup"
    assert wait["args"] == [*agent_args, "--cleanup", "--then-wait"] and wait["name"] == "node-agent"
    assert (
        init["volumeMounts"] == wait["volumeMounts"] == [{"name": "state", "mountPath": "/var/run/gpuweave"}]
    )
    assert "ports" not in init and "ports" not in wait
    assert template["metadata"]["annotations"] == {UNINSTALL_ANNOTATION: "true"}
    assert new["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "100%"}
    assert (
        "status" not in new and DAEMONSET["spec"]["template"]["spec"]["containers"][0]["args"] == agent_args
    )
    assert cleanup_daemonset(new)["spec"]["template"] == template  # a second run changes nothing


def test_the_rollout_is_done_when_every_scheduled_pod_of_the_new_generation_is_ready() -> None:
    daemonset = copy.deepcopy(DAEMONSET)
    status = {
        "desiredNumberScheduled": 2,
        "updatedNumberScheduled": 2,
        "numberReady": 1,
        "observedGeneration": 3,
    }
    daemonset["status"] = status
    assert not rollout(daemonset).done
    daemonset["status"] = {**status, "numberReady": 2}
    assert rollout(daemonset).done
    daemonset["status"] = {**status, "numberReady": 2, "observedGeneration": 2}  # the old template's count
    assert not rollout(daemonset).done


def test_cleaned_nodes_are_those_whose_cleanup_pod_is_ready() -> None:
    def pod(node: str, *, ready: bool, cleanup: bool = True) -> dict[str, Any]:
        annotations = {UNINSTALL_ANNOTATION: "true"} if cleanup else {}
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        return {
            "metadata": {"annotations": annotations},
            "spec": {"nodeName": node},
            "status": {"conditions": [condition]},
        }

    pods = [pod("a", ready=True), pod("b", ready=False), pod("c", ready=True, cleanup=False)]
    assert cleaned_nodes(pods) == {"a"}


def test_gfd_labels_alone_do_not_make_a_node_gpuweaves() -> None:
    """The uninstall sweep leaves nodes alone whose nvidia.com labels NVIDIA's GFD wrote."""
    gfd = {"metadata": {"labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "H100"}}}
    assert leftovers(gfd) and not marked_by_gpuweave(leftovers(gfd))
    assert marked_by_gpuweave(leftovers(_node()))
    topology_only = {"metadata": {"labels": {"gpuweave.io/topology": "nvswitch-8"}}}
    assert marked_by_gpuweave(leftovers(topology_only))
    condition_only = {"status": {"conditions": [{"type": "GpuweaveHealthStateSaved", "status": "True"}]}}
    assert marked_by_gpuweave(leftovers(condition_only))
