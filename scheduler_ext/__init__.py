"""The kube-scheduler extender (filter, prioritize, bind, preempt), in rooms that import downwards:
``pods`` (what a pod asks for) < ``decide`` (the pure decision core) < ``cluster`` (the cluster
cache, claims, preemption) < ``gangs`` < ``serving`` (the verbs, HTTP, wire, probes, metrics,
events); ``app`` wires one process and ``kube`` runs it against a cluster. Code outside the
extender imports only ``api``, its front door. import-linter holds the order and the door
(pyproject.toml); docs/architecture.md walks a request through it.
"""
