"""Kubelet plugin-watcher registration API v1: api.proto and its generated stubs."""
