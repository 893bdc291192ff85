"""Topology: the graph of one node's GPUs and NICs, GPU set scoring and search, fragmentation,
and network tiers between nodes. Pure: values in, decisions out; built on ``devicemodel``.
"""
