"""One pod builder for the tests: the Pod object a test sends to the API server or the extender.

Every field a test varies is a keyword; what no test varies (one container, an image that is
never pulled) is fixed here, so a test's pod says only what the test is about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CONTAINER = "c"
IMAGE = "busybox"
SCHEDULER_NAME = "gpuweave-scheduler"


def pod_body(
    name: str,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    node: str = "",
    scheduler: str | None = None,
    limits: Mapping[str, int | str] | None = None,
    claims: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    grace_s: int | None = None,
    container: str = CONTAINER,
    image: str = IMAGE,
) -> dict[str, Any]:
    """A v1 Pod with one container.

    ``limits``: the container's resource limits (values as strings, as the API returns them);
    ``claims``: pod claim name -> ResourceClaim name, each used by the container; ``node``: bound
    already (``spec.nodeName``); ``tolerations`` get ``operator: Equal`` unless they say one."""
    body: dict[str, Any] = {"name": container, "image": image}
    if limits is not None:
        body["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    spec: dict[str, Any] = {"containers": [body]}
    if claims:
        spec["resourceClaims"] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
        body.setdefault("resources", {})["claims"] = [{"name": k} for k in claims]
    optional = {
        "nodeName": node or None,
        "schedulerName": scheduler,
        "nodeSelector": dict(node_selector) if node_selector else None,
        "tolerations": [{"operator": "Equal", **t} for t in tolerations] or None,
        "terminationGracePeriodSeconds": grace_s,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    metadata: dict[str, Any] = {
        "name": name,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    metadata.update({k: v for k, v in (("namespace", namespace), ("uid", uid)) if v is not None})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
