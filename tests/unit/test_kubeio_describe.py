"""``kubeio.errors.describe``: an API failure in one log line, with the server's own reason."""

from __future__ import annotations

import json

from kubernetes.client.rest import ApiException

from kubeio.errors import MAX_MESSAGE_CHARS, KubeApiError, describe


def _refusal(status: int, reason: str, body: object) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = body
    return exc


def test_the_status_message_follows_the_http_status() -> None:
    message = "workloads.kueue.x-k8s.io \"w\" is forbidden: ValidatingAdmissionPolicy 'p' denied request"
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": 422})
    assert (
        describe(_refusal(422, "Unprocessable Entity", body)) == f"HTTP 422 Unprocessable Entity: {message}"
    )
    assert describe(_refusal(422, "Unprocessable Entity", body.encode())).endswith("denied request")


def test_without_a_status_body_only_the_http_status_is_said() -> None:
    for body in (None, "", "not json", "[1, 2]", json.dumps({"message": 7}), json.dumps({"kind": "Status"})):
        assert describe(_refusal(409, "Conflict", body)) == "HTTP 409 Conflict"


def test_a_long_or_hostile_message_is_cut_and_kept_on_one_line() -> None:
    body = json.dumps({"message": "pod\nforged log line\x1b[31m" + "x" * 10_000})
    said = describe(_refusal(400, "Bad Request", body))
    assert "\n" not in said and "\x1b" not in said
    assert len(said) < MAX_MESSAGE_CHARS + 100 and said.endswith("characters)")
    huge = json.dumps({"message": "m" * 100}) + " " * 70_000  # past the bound: not parsed at all
    assert describe(_refusal(400, "Bad Request", huge)) == "HTTP 400 Bad Request"


def test_our_own_errors_and_transport_failures_keep_their_text() -> None:
    assert describe(KubeApiError("listing nodes failed: HTTP 403 Forbidden", status=403)).startswith(
        "listing"
    )
    assert describe(ConnectionResetError("reset by peer")) == "reset by peer"
