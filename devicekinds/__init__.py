"""Resource kinds: each kind of device gpuweave serves (whole GPU, MIG slice, fractional share,
time-sliced replica, EFA adapter, IMEX channel), one module each, behind one interface
(``kind.ResourceKind``) and listed in one registry (``registry.KINDS``).

The extender, the device plugin and the DRA driver ask the registry which kind owns a resource
name and then ask that kind: how a pod's count of it is checked, which devices a node offers,
how a set is chosen, what Allocate returns, how a grant is named in a status line.
"""
