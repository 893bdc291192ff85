"""Kubelet DRA plugin API v1beta1 (service ``v1beta1.DRAPlugin``): api.proto and its generated stubs."""
