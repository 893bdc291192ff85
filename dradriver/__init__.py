"""The node agent as a Dynamic Resource Allocation driver (``gpuweave.io``): ResourceSlices built from
the device model the device plugin serves, health as device taints, and the kubelet DRA plugin."""
