"""The extender's view of the cluster: watched objects read into records, the cluster cache (who
holds which device, reservations in flight), the DRA claim book, offline snapshots, and
preemption choices made over the cache.
"""
