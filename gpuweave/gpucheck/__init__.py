"""``gpuweave gpu-check``: the read-only check of a real NVIDIA host, or of the simulator with --simulate.

Product code only, so it runs wherever gpuweave is installed (the node agent's image included);
``scripts/gpu-check`` in the repository runs the same check. ``check`` holds the steps and the
report, ``agent`` the node-agent step and its ``nvidia-smi`` guard, ``record`` the NVML recording
and its replay, ``process`` how child processes find the same gpuweave. docs/gpu-check.md.
"""
