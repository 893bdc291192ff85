"""Names that pods, nodes and other components depend on.

These are contracts (docs/architecture.md, Contracts): changing one breaks users' pod specs or the
handoff between the extender and the node agent. Keep old names working when adding new ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# Resource names users' pod specs already carry.
RESOURCE_GPU: Final = "nvidia.com/gpu"
RESOURCE_MIG_PREFIX: Final = "nvidia.com/mig-"  # + profile, e.g. nvidia.com/mig-3g.40gb
RESOURCE_EFA: Final = "vpc.amazonaws.com/efa"

# Fractional GPUs (gpuweave's own names). One unit of compute is 1% of one GPU's SMs,
# one unit of memory is 1 GiB of one GPU's memory. A container's units all come from one GPU.
RESOURCE_GPU_COMPUTE: Final = "gpuweave.io/gpu-compute"
RESOURCE_GPU_MEMORY: Final = "gpuweave.io/gpu-memory"
# Time-sliced replicas of whole GPUs (configurable per GPU).
RESOURCE_GPU_SHARED: Final = "gpuweave.io/gpu-shared"
# An IMEX channel on nodes in a multi-node NVLink domain (GB200/GB300 NVL72): the device node
# ``/dev/nvidia-caps-imex-channels/channel<N>`` and ``NVIDIA_IMEX_CHANNELS=<N>`` in the container.
RESOURCE_IMEX_CHANNEL: Final = "gpuweave.io/imex-channel"
IMEX_CHANNEL_DIR: Final = "/dev/nvidia-caps-imex-channels"
IMEX_CHANNELS_ENV: Final = "NVIDIA_IMEX_CHANNELS"

# Pod annotations.
ANNOTATION_GPU_SELECTOR: Final = "gpuweave.io/gpu-selector"  # CEL over DRA-named attributes
ANNOTATION_PLACEMENT: Final = "gpuweave.io/placement"  # best-effort | nvlink-required | nic-aligned ...
ANNOTATION_ASSIGNMENT: Final = "gpuweave.io/assignment"  # extender's device choice (JSON), set at bind
ANNOTATION_OPT_OUT_EVICTION: Final = "gpuweave.io/no-health-eviction"  # label: "true" opts a pod out

# DRA-style attribute domain for capability selectors.
ATTRIBUTE_DOMAIN: Final = "gpuweave.io"

# Published objects.
API_GROUP: Final = "gpuweave.io"
API_VERSION: Final = "v1alpha1"
NODE_INVENTORY_KIND: Final = "GpuNodeInventory"
NODE_INVENTORY_PLURAL: Final = "gpunodeinventories"
BAD_HARDWARE_KIND: Final = "GpuBadHardware"
BAD_HARDWARE_PLURAL: Final = "gpubadhardwares"
PREFLIGHT_KIND: Final = "GpuPreflight"  # a gang's preflight on one node (devicemodel/preflight.py)
PREFLIGHT_PLURAL: Final = "gpupreflights"
LABEL_PREFLIGHT: Final = "gpuweave.io/preflight"  # node label: "agent" while its agent serves GpuPreflights
MIG_LAYOUT_ANNOTATION: Final = "gpuweave.io/mig-layout"  # per-node declared MIG layout (node annotation)
LABEL_SHARING_CONFIG: Final = "gpuweave.io/sharing-config"  # node label: its named sharing configuration
SCHEDULER_NAME: Final = "gpuweave-scheduler"  # pods opt in with spec.schedulerName

# The node lifecycle (docs/node-lifecycle.md). The node agent publishes its node-level verdict as a
# node condition (Ready polarity: True while every fault can be handled on the node; False with
# the reason naming the act only the node's engine can do); the lifecycle controller reads it.
CONDITION_NODE_SERVICEABLE: Final = "GpuweaveNodeServiceable"
VERDICT_SERVICEABLE: Final = "Serviceable"  # the reason while True
VERDICT_REBOOT: Final = "RebootRequired"  # a device can come back only through a node reboot
VERDICT_REPLACE: Final = "ReplaceRequired"  # a GPU is retired: the machine must be replaced
# The condition the EKS node monitoring agent publishes for accelerator faults, which Karpenter's
# AWS provider repairs on (False for its toleration duration): set by the lifecycle controller.
CONDITION_ACCELERATED_HARDWARE_READY: Final = "AcceleratedHardwareReady"
# Pod label: "true" keeps the lifecycle controller from handing the pod's node to its engine.
LABEL_OPT_OUT_REPLACEMENT: Final = "gpuweave.io/no-node-replacement"
# Node annotation: the lifecycle controller's record of a handover (JSON).
ANNOTATION_REPLACEMENT: Final = "gpuweave.io/replacement"


def mig_resource_name(profile: str) -> str:
    """``nvidia.com/mig-<profile>`` as the mixed MIG strategy names it.

    A ``+`` is not allowed in an extended resource name, so media-engine profiles get their own
    resource with ``.`` instead: ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``. (NVIDIA's plugin
    folds them into the plain profile's resource, so a pod cannot ask for the media engines.)
    """
    return f"{RESOURCE_MIG_PREFIX}{profile.replace('+', '.')}"


def mig_profile_of_resource(resource: str) -> str | None:
    """The MIG profile a ``nvidia.com/mig-*`` resource name stands for, or None for other names."""
    if not resource.startswith(RESOURCE_MIG_PREFIX):
        return None
    profile = resource[len(RESOURCE_MIG_PREFIX) :]
    for suffix in (".me.all", ".me", ".gfx"):
        if profile.endswith(suffix):
            return profile[: -len(suffix)] + "+" + suffix[1:]
    return profile


def imex_channel_path(channel: int) -> str:
    """The host (and container) device node of IMEX channel ``channel``."""
    return f"{IMEX_CHANNEL_DIR}/channel{channel}"


def requests_resource(pod: Mapping[str, Any], resource: str) -> bool:
    """Whether any container of the pod (init ones too) asks for ``resource`` (limit or request,
    a count other than zero). Tolerant of malformed specs: they ask for nothing."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for section in ("initContainers", "containers"):
        containers = spec.get(section)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            for part in ("limits", "requests"):
                values = resources.get(part) if isinstance(resources, Mapping) else None
                if isinstance(values, Mapping) and values.get(resource) not in (None, 0, "0"):
                    return True
    return False
