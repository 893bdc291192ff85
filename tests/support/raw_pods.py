"""Pods through the real ``kubernetes`` client as the API server stores them (raw JSON dicts), for
transport tests that build pod bodies with ``gpuweave.simulate.cluster_objects.pod_object``."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client, config


def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]


def create_pod(kubeconfig: str, body: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    """Create ``body`` (a sample pod: the server-set fields are dropped first); the stored pod."""
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        body["metadata"].pop(key, None)
    body.pop("status", None)
    with api_client(kubeconfig) as api:
        created = client.CoreV1Api(api).create_namespaced_pod(namespace, body, _preload_content=False)
        result: dict[str, Any] = json.loads(created.data)
    return result


def read_pod(kubeconfig: str, name: str, namespace: str = "default") -> dict[str, Any]:
    with api_client(kubeconfig) as api:
        response = client.CoreV1Api(api).read_namespaced_pod(name, namespace, _preload_content=False)
        result: dict[str, Any] = json.loads(response.data)
    return result
