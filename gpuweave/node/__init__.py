"""The node agent's composition: one builder that turns flags and a hardware backend into a running
agent (device plugin or DRA driver, CDI, MPS, health, MIG, fabric gate), used by
``gpuweave node-agent`` and by ``gpuweave simulate``'s simulated nodes alike.
"""
