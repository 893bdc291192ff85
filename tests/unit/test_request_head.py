"""The request head reader: the fields kube-scheduler sends, and the heads it refuses."""

from __future__ import annotations

import io
from http import HTTPStatus

import pytest

from scheduler_ext.serving.request_head import (
    MAX_FIELDS,
    MAX_LENGTH_DIGITS,
    MAX_LINE,
    HeadError,
    body_length,
    read_headers,
    request_version,
)


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


@pytest.mark.parametrize(
    ("head", "length"),
    [
        (b"Host: x\r\n\r\n", None),
        (b"Content-Length: 0\r\n\r\n", 0),
        (b"Content-Length:  1192 \r\n\r\n", 1192),  # whitespace around a field value is not the value
        (b"Content-Length: " + b"0" * 40 + b"11\r\n\r\n", 11),  # 1*DIGIT: leading zeros are digits
        (b"Content-Length: " + b"9" * MAX_LENGTH_DIGITS + b"\r\n\r\n", 10**MAX_LENGTH_DIGITS - 1),
    ],
)
def test_body_length_is_the_content_length(head: bytes, length: int | None) -> None:
    assert body_length(read_headers(io.BytesIO(head))) == length


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"1_1_9_2", "ASCII digits only"),
        (b"+1192", "ASCII digits only"),
        (b"-1", "ASCII digits only"),
        (b"0x4a8", "ASCII digits only"),
        (b"1 192", "ASCII digits only"),
        (b"", "ASCII digits only"),
        ("\u0661\u0661".encode(), "ASCII digits only"),  # int() takes Arabic-Indic digits
        (b"9" * (MAX_LENGTH_DIGITS + 1), "digits"),
        (b"9" * 5000, "digits"),  # int() refuses past 4,300 digits with a ValueError
    ],
)
def test_a_content_length_that_is_not_1_digit_is_refused(value: bytes, reason: str) -> None:
    with pytest.raises(HeadError) as caught:
        body_length(read_headers(io.BytesIO(b"Content-Length: " + value + b"\r\n\r\n")))
    assert caught.value.status == HTTPStatus.BAD_REQUEST and reason in caught.value.reason


@pytest.mark.parametrize("fields", [b"Transfer-Encoding: chunked\r\n", b"transfer-encoding: identity\r\n"])
def test_any_transfer_encoding_is_refused_with_or_without_a_length(fields: bytes) -> None:
    for head in (fields, fields + b"Content-Length: 2\r\n", b"Content-Length: 2\r\n" + fields):
        with pytest.raises(HeadError) as caught:
            body_length(read_headers(io.BytesIO(head + b"\r\n")))
        assert caught.value.status == HTTPStatus.BAD_REQUEST and "Transfer-Encoding" in caught.value.reason
