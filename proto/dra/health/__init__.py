"""Kubelet DRA resource-health API (service ``v1.DRAResourceHealth``), optional for a DRA driver."""
