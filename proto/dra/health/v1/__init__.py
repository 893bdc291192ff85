"""Kubelet DRA resource-health API v1: api.proto and its generated stubs."""
