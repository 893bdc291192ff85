"""What the API server answered a call, as one string a test can search: for admission and RBAC tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException


def outcome(call: Callable[[], Any]) -> str:
    """ "ok", or the API server's refusal: its status and the answer's body (the policy's message)."""
    try:
        call()
    except ApiException as exc:
        return f"{exc.status} {exc.body}"
    return "ok"
