"""Kubelet DRA plugin API: the NodePrepareResources / NodeUnprepareResources service a DRA driver serves."""
