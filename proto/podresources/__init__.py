"""Kubelet pod-resources API: what the kubelet has allocated to each pod's containers."""
