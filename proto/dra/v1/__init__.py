"""Kubelet DRA plugin API v1 (service ``v1.DRAPlugin``): api.proto and its generated stubs."""
