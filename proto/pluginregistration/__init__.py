"""Kubelet plugin-watcher registration API (``pluginregistration.Registration``)."""
