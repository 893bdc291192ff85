"""What a pod asks of gpuweave: device requests per container, Kubernetes quantities, host CPU and
memory requests, and capability selectors (CEL, with a static cost bound and a sandboxed worker).
Reads pod specs into values; depends on nothing else in the extender.
"""
