"""The node agent's composition: ``builder.NodeAgentBuilder`` turns a hardware backend and an
``AgentConfig`` into the agent and its parts (MPS, MIG, health, fabric gate), the same way for
``gpuweave node-agent`` and for ``gpuweave simulate``'s simulated nodes; for the process it also
opens the backend and starts the parts in order (with the API server, DRA and ``/metrics``). The
other modules wire one part each (``cdi``, ``dra``, ``fabric``, ``health``, ``mig``, ``mps``) and
``flags`` holds a flag shared with ``gpuweave publish``.
"""
