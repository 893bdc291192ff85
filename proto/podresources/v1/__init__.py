"""Kubelet pod-resources API v1: api.proto and its generated stubs."""
