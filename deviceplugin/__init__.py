"""The node agent's device-plugin side: the device catalogue, one kubelet-facing gRPC server per
resource, allocation, the extender handoff, MPS supervision, publishing, and the ``NodeAgent``
that runs them. Composed into a process by ``gpuweave.node``.
"""
