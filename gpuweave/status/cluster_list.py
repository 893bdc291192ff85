"""The API side of ``gpuweave status``: one list call per kind, raw JSON, nothing else.

The kinds and calls are the extender's own (``kube.list_calls``), plus the GpuBadHardware list.
Bodies stay raw (``_preload_content=False`` + orjson, as the extender's watches read them), and
each item gets its ``kind`` back (a list's items carry none), so ``ClusterView.of`` reads them
exactly as it reads a snapshot file. A cluster without the GpuBadHardware CRD has no list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from devicemodel.contracts import API_GROUP, API_VERSION, BAD_HARDWARE_KIND, BAD_HARDWARE_PLURAL
from kubeio.errors import NOT_FOUND, api_error, status_of
from scheduler_ext.api import list_calls

FORBIDDEN = 403


def list_cluster(api: client.ApiClient) -> list[dict[str, Any]]:
    """Every Node, GpuNodeInventory, Pod and GpuBadHardware object, each with its ``kind``."""
    objects: list[dict[str, Any]] = []
    for plural, kind, call in list_calls(api):
        objects += _items(call, kind=kind, plural=plural)
    custom = client.CustomObjectsApi(api)

    def list_bad_hardware(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(API_GROUP, API_VERSION, BAD_HARDWARE_PLURAL, **kwargs)

    objects += _items(list_bad_hardware, kind=BAD_HARDWARE_KIND, plural=BAD_HARDWARE_PLURAL, optional=True)
    return objects


def _items(
    call: Callable[..., Any], *, kind: str, plural: str, optional: bool = False
) -> list[dict[str, Any]]:
    """The list's items; ``optional``: a kind whose CRD is not installed lists as empty."""
    try:
        response = call(_preload_content=False)
    except (ApiException, HTTPError, OSError) as exc:
        if optional and status_of(exc) == NOT_FOUND:
            return []
        hint = (
            f"check `kubectl auth can-i list {plural} --all-namespaces` for this kubeconfig's user"
            if status_of(exc) == FORBIDDEN
            else "check --kubeconfig and that the API server answers"
        )
        raise api_error(exc, doing=f"listing {plural}", hint=hint) from None
    body = orjson.loads(response.data)
    return [{**item, "kind": kind} for item in body.get("items") or []]
