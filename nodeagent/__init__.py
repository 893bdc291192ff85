"""The node agent's core, shared by its two kubelet-facing front ends (``deviceplugin`` and
``dradriver``): the ``NodeAgent`` (inventory, per-resource device lists, health, control socket),
the device catalogue, CDI specs, the container grant, MPS supervision, publishing, per-pod GPU use,
the IMEX domain's plan, and the gRPC pieces both front ends serve with. Composed into a process by
``gpuweave.node``.
"""
