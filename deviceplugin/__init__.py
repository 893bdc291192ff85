"""The node agent's device-plugin front end: one kubelet-facing gRPC server per resource,
registration, GetPreferredAllocation and Allocate, the extender handoff, over the core in
``nodeagent``. Composed into a process by ``gpuweave.node``.
"""
