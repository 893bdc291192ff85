"""Pure core: inventory values, the topology graph, set scoring and fragmentation.

Nothing in this package performs I/O or imports a transport or hardware library.
"""
