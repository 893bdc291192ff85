"""The request head reader: the fields kube-scheduler sends, and the heads it refuses."""

from __future__ import annotations

import io
from http import HTTPStatus

import pytest

from scheduler_ext.request_head import MAX_FIELDS, MAX_LINE, HeadError, read_headers, request_version


def _read(head: bytes) -> dict[str, str]:
    headers = read_headers(io.BytesIO(head))
    return {name: headers[name] for name in headers}


def test_fields_are_found_without_case_and_the_first_repeat_wins() -> None:
    rfile = io.BytesIO(b"Host: x\r\ncontent-LENGTH:  12 \r\nAccept: a\r\nAccept: b\r\n\r\n{body}")
    headers = read_headers(rfile)
    assert headers.get("Content-Length") == "12" and headers["host"] == "x"
    assert headers.get("Accept") == "a" and "ACCEPT" in headers and len(headers) == 3
    assert headers.get("Expect") is None and headers.get("Expect", "") == ""
    assert rfile.read() == b"{body}"  # the body is left for the handler


def test_a_head_may_end_with_a_bare_newline_or_the_stream() -> None:
    assert _read(b"Host: x\n\n") == {"host": "x"}
    assert _read(b"Host: x\r\n") == {"host": "x"}


@pytest.mark.parametrize(
    ("head", "status", "reason"),
    [
        (b"Host: x\r\n folded\r\n\r\n", HTTPStatus.BAD_REQUEST, "folded"),
        (b"Host x\r\n\r\n", HTTPStatus.BAD_REQUEST, "malformed"),
        (b": x\r\n\r\n", HTTPStatus.BAD_REQUEST, "malformed"),
        (b"Content-Length : 2\r\n\r\n", HTTPStatus.BAD_REQUEST, "malformed"),
        (b"Content-Length: 2\r\nContent-Length: 20\r\n\r\n", HTTPStatus.BAD_REQUEST, "conflicting"),
        (b"X: " + b"a" * MAX_LINE + b"\r\n\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too long"),
        (b"X: a\r\n" * (MAX_FIELDS + 1) + b"\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "more than"),
    ],
)
def test_heads_that_invite_smuggling_or_cost_are_refused(
    head: bytes, status: HTTPStatus, reason: str
) -> None:
    with pytest.raises(HeadError) as caught:
        read_headers(io.BytesIO(head))
    assert caught.value.status == status and reason in caught.value.reason


def test_the_same_content_length_twice_is_accepted() -> None:
    assert _read(b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n") == {"content-length": "2"}


def test_exactly_the_field_limit_is_accepted() -> None:
    head = b"".join(f"X-{i}: a\r\n".encode() for i in range(MAX_FIELDS)) + b"\r\n"
    assert len(_read(head)) == MAX_FIELDS


@pytest.mark.parametrize(
    ("version", "expected"), [("HTTP/1.1", (1, 1)), ("HTTP/1.0", (1, 0)), ("HTTP/2.0", (2, 0))]
)
def test_request_versions(version: str, expected: tuple[int, int]) -> None:
    assert request_version(version) == expected


@pytest.mark.parametrize(
    "version", ["HTTP/1", "HTTP/1.1.1", "HTTP/x.1", "FTP/1.1", "HTTP/1.٣", "HTTP/" + "1" * 11 + ".1"]
)
def test_bad_request_versions(version: str) -> None:
    with pytest.raises(HeadError) as caught:
        request_version(version)
    assert caught.value.status == HTTPStatus.BAD_REQUEST
