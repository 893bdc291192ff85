"""The HTTP(S) adapter: kube-scheduler's extender calls in, JSON out; stdlib ``http.server``.

Every request is answered: a body that is too large, not JSON, or not the verb's message gets
400 with a one-line reason and the connection stays usable. Framing is strict on every route
(``request_head.body_length``): ``Content-Length`` is ASCII digits only, and a request with
``Transfer-Encoding`` (chunked or any other, with or without ``Content-Length``) is refused and
its connection closed, so no proxy in between can read the request's end elsewhere than we do; a
GET's body is read and dropped. A pod (or a node, or a victim) nested deeper than
``MAX_POD_DEPTH`` is refused (400): the cost of walking it is bounded and no comparison, copy or
encoding of it can recurse past a limit. Keep-alive (HTTP/1.1) matters here:
kube-scheduler calls filter and prioritize for every pod, and a TCP handshake per call would
cost more than the decision.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import orjson

from devicemodel.errors import InvalidInputError, clip, echo
from scheduler_ext.decide.by_state import RejectedNames
from scheduler_ext.serving.metrics import ExtenderMetrics
from scheduler_ext.serving.request_head import (
    HeadError,
    RequestHeaders,
    body_length,
    read_headers,
    request_version,
)
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    KubeObject,
    WireError,
    canonical_keys,
    parse,
)

LOG = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DRAIN_BYTES = 64 * 1024 * 1024  # read and discard up to this much of an oversized body
JSON = "application/json"
MAX_POD_DEPTH = 64  # objects and lists inside the pod; Kubernetes' own (managedFields) stay under 30
_ENVELOPE_DEPTH = 4  # a node or victim pod sits this much deeper in its field (Nodes.items[i], ...)
# fields not walked: NodeNames holds strings only; preempt's meta victims keep nothing as sent
# (pydantic reads UIDs and a count, ignoring every other key), and hundreds arrive per call
_FLAT_FIELDS = frozenset({"NodeNames", "NodeNameToMetaVictims"})


LISTEN_BACKLOG = 1024  # connections the kernel queues before accept (capped by net.core.somaxconn)


class ExtenderHTTPServer(ThreadingHTTPServer):
    """One thread per connection; holds the service and metrics the handler uses.

    The listen backlog is ``LISTEN_BACKLOG``, not socketserver's 5: kube-scheduler binds in
    parallel goroutines (one per pod in its binding cycle) and opens a connection per call when
    its pool runs dry; with a backlog of 5, 200 simultaneous binds lost most of their connections.
    """

    daemon_threads = True
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self, address: tuple[str, int], *, service: ExtenderService, metrics: ExtenderMetrics
    ) -> None:
        self.service = service
        self.metrics = metrics
        self._tls: ssl.SSLContext | None = None
        self.priorities = PriorityEncoder()
        self.checked_pods = CheckedPods()
        super().__init__(address, ExtenderHandler)

    def use_tls(self, *, cert: Path, key: Path) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(certfile=str(cert), keyfile=str(key))
        except (ssl.SSLError, OSError) as exc:
            raise InvalidInputError(f"cannot load TLS certificate {cert} with key {key}: {exc}") from None
        self._tls = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS handshakes run here, in the connection's own thread, never in the accept loop."""
        if self._tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(ExtenderHandler.timeout)
        try:
            wrapped = self._tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            LOG.info("TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            wrapped.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host!s}:{port}"

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="gpuweave-extender-http", daemon=True)
        thread.start()
        return thread


BOUND = ExtenderBindingResult(Error="").model_dump_json().encode()  # every successful bind's answer


def decode_body(body: bytes) -> object:
    """A request body as JSON values. orjson: a 5,000-name body decodes in about half the time of
    ``json.loads``; it also refuses NaN/Infinity and integers beyond 64 bits, which no Kubernetes
    object holds. Raises ``ValueError`` (``orjson.JSONDecodeError``) on anything that is not JSON."""
    return orjson.loads(body)


def encode_filter_result(result: ExtenderFilterResult) -> bytes:
    """The filter answer; the common nodeCacheCapable form goes through orjson, which encodes the
    5,000-entry name list and FailedNodes map about 15x faster than ``json.dumps``."""
    if result.Nodes is not None:
        return result.model_dump_json().encode()
    return b"".join(
        (
            b'{"Nodes":null,"NodeNames":',
            orjson.dumps(result.NodeNames),
            b',"FailedNodes":',
            _rejected_json(result.FailedNodes),
            b',"FailedAndUnresolvableNodes":',
            _rejected_json(result.FailedAndUnresolvableNodes),
            b',"Error":',
            orjson.dumps(result.Error),
            b"}",
        )
    )


def _rejected_json(rejected: Mapping[str, str]) -> bytes:
    """A rejected-names map as JSON: per state for ``RejectedNames`` (filter's usual answer)."""
    if isinstance(rejected, RejectedNames):
        return rejected.json()
    return orjson.dumps(dict(rejected))


class PriorityEncoder:
    """Encodes a HostPriorityList without a dict per node: cached ``{"Host":"<name>"`` prefixes
    joined with one of eleven ``,"Score":n}`` suffixes, all in C-level ``map`` calls."""

    MAX_CACHED_HOSTS = 100_000
    _SUFFIXES = tuple(f',"Score":{score}}}' for score in range(11))

    def __init__(self) -> None:
        self._prefixes: dict[str, str] = {}

    def encode(self, hosts: list[str], scores: list[int]) -> bytes:
        prefixes = self._prefixes
        if not all(map(prefixes.__contains__, hosts)):
            if len(prefixes) > self.MAX_CACHED_HOSTS:
                prefixes.clear()
            prefixes.update((h, '{"Host":' + encode_basestring(h)) for h in hosts if h not in prefixes)
        entries = map(str.__add__, map(prefixes.__getitem__, hosts), map(self._SUFFIXES.__getitem__, scores))
        return ("[" + ",".join(entries) + "]").encode()


class CheckedPods:
    """The last ``MAX_PODS`` pods a filter, prioritize or preempt message carried that passed the
    depth check and validation, per UID, with their validated model: kube-scheduler sends each pod
    to filter, then the same pod to prioritize (or, when no node passed, to preempt). A pod equal
    to the one kept for its UID (``==``: bounded by the kept pod's checked depth) would pass both
    again with the same model, so its message skips them for the pod (about a tenth of the
    extender's CPU per pod went to the two checks of the same pod). Thread-safe."""

    MAX_PODS = 1024

    def __init__(self) -> None:
        self._kept: OrderedDict[str, tuple[Mapping[str, Any], KubeObject]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _uid(pod: object) -> str | None:
        metadata = pod.get("metadata") if isinstance(pod, dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        return uid if isinstance(uid, str) and uid else None

    def match(self, pod: object) -> KubeObject | None:
        """The validated model of ``pod`` when it equals the pod kept for its UID."""
        uid = self._uid(pod)
        kept = self._kept.get(uid) if uid is not None else None
        if kept is None or type(kept[0]) is not type(pod) or kept[0] != pod:
            return None
        return kept[1]

    def keep(self, pod: object, model: KubeObject) -> None:
        uid = self._uid(pod)
        if uid is None or not isinstance(pod, dict):
            return
        with self._lock:
            self._kept[uid] = (pod, model)
            self._kept.move_to_end(uid)
            while len(self._kept) > self.MAX_PODS:
                self._kept.popitem(last=False)


class BadRequestError(Exception):
    def __init__(self, reason: str, *, close: bool = False) -> None:
        super().__init__(reason)
        self.close = close


def nested_deeper_than(value: object, limit: int) -> bool:
    """True when ``value`` (decoded JSON) nests objects and lists more than ``limit`` deep; iterative,
    so a hostile depth costs one pass and no recursion."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def check_depth(raw: Mapping[str, Any]) -> None:
    """Raise ``BadRequestError`` when a field of a verb's message (the pod, the nodes
    kube-scheduler sends without nodeCacheCapable, preempt's victims) nests deeper than
    ``MAX_POD_DEPTH`` objects and lists: past it, pydantic's encoding and Python's recursive
    comparisons and copies fail (a 1,000-deep pod or node gave 500)."""
    for field, value in raw.items():
        if field in _FLAT_FIELDS:
            continue
        limit = MAX_POD_DEPTH if field == "Pod" else MAX_POD_DEPTH + _ENVELOPE_DEPTH
        if nested_deeper_than(value, limit):
            shown = "the pod" if field == "Pod" else f"field {echo(field, limit=40)}"
            raise BadRequestError(f"{shown} nests objects or lists deeper than {limit} levels")


class _HttpDate:
    """The ``Date`` field's value, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._text, self._second = formatdate(second, usegmt=True), second
        return self._text


_DATE = _HttpDate()


class ExtenderHandler(BaseHTTPRequestHandler):
    """kube-scheduler's calls over keep-alive HTTP/1.1. The request head is read by
    ``request_head`` and the answer's head written in one piece with its body: the standard
    library's ``email``-based header parsing was 12% of the extender's CPU per scheduled pod in a
    profiled end-to-end run."""

    protocol_version = "HTTP/1.1"
    server: ExtenderHTTPServer
    headers: RequestHeaders  # type: ignore[assignment]
    raw_requestline: bytes
    declared_length: int | None = None  # the body's Content-Length, checked with the head
    server_version = "gpuweave-extender"
    timeout = 30  # seconds a client may stall mid-request before the connection is dropped

    def parse_request(self) -> bool:
        """The request line and header fields (``BaseHTTPRequestHandler.handle_one_request`` calls
        this); False once an error is answered. HTTP/1.0 and 1.1 only (no 0.9, which the
        standard library answers without a status line); keep-alive unless the client says close
        (or speaks 1.0 without asking for keep-alive)."""
        self.command = None  # type: ignore[assignment]  # set once the request line is read
        self.request_version = self.protocol_version  # every answer, refusals too, has a status line
        self.close_connection = True
        self.declared_length = None
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        try:
            if len(words) != 3:
                raise HeadError(HTTPStatus.BAD_REQUEST, f"bad request syntax {self.requestline[:200]!r}")
            command, path, version = words
            major, minor = request_version(version)
            if major != 1:
                raise HeadError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"{version} is not served")
            self.request_version = version
            self.command = command
            self.path = "/" + path.lstrip("/") if path.startswith("//") else path  # as the stdlib does
            self.headers = read_headers(self.rfile)
            self.declared_length = body_length(self.headers)
        except HeadError as exc:
            self.send_error(exc.status, exc.reason)
            return False
        connection = (self.headers.get("Connection") or "").lower()
        self.close_connection = connection == "close" or (minor == 0 and connection != "keep-alive")
        if (self.headers.get("Expect") or "").lower() == "100-continue" and minor >= 1:
            return self.handle_expect_100()
        return True

    def setup(self) -> None:
        super().setup()
        # Without NODELAY, Nagle's algorithm can hold an answer's last segment until the client's
        # delayed ACK, and a large answer would wait ~40 ms.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)

    # ---- routing ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self.declared_length and not self._drain(self.declared_length):
            self.close_connection = True  # too large to drain: the stream is out of step after it
        path = self.path.split("?", 1)[0].rstrip("/")
        cache = self.server.service.cache
        if path.endswith("/healthz"):
            self._send(200, b"ok\n", "text/plain")
        elif path.endswith("/readyz"):
            ready = cache.synced.is_set()
            self._send(200 if ready else 503, b"ok\n" if ready else b"cache not synced\n", "text/plain")
        elif path.endswith("/metrics"):
            self.server.metrics.scraped(nodes=len(cache.node_names()), ready=cache.synced.is_set())
            self._send(200, self.server.metrics.render(), "text/plain; version=0.0.4")
        elif path.endswith("/workload"):  # read-only: the mix the scorer places against now
            document = self.server.service.core.workload.document()
            self._send(200, orjson.dumps(document), "application/json")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        handler = self._verbs().get(verb)
        if handler is None:
            self._drain(self.declared_length or 0)
            self._send(404, f"unknown extender verb {echo(verb)}\n".encode(), "text/plain")
            return
        started = time.perf_counter()
        try:
            body = self._read_json()
            payload = handler(body)
        except (BadRequestError, WireError) as exc:
            self.server.metrics.bad_requests.labels(verb).inc()
            LOG.info("400 on %s: %s", verb, exc)
            self.close_connection = bool(getattr(exc, "close", False))
            self._send(400, f"{exc}\n".encode(), "text/plain")
            return
        except Exception as exc:  # a bug must cost one answer, not the connection or the server
            LOG.exception("internal error on %s", verb)
            self._send(
                500, f"internal error in the gpuweave extender: {type(exc).__name__}\n".encode(), "text/plain"
            )
            return
        self._send(200, payload, JSON)
        self.server.metrics.verb_latency(verb).observe(time.perf_counter() - started)

    def _verbs(self) -> Mapping[str, Callable[[object], bytes]]:
        return {
            "filter": self._filter,
            "prioritize": self._prioritize,
            "prioritize-claims": self._prioritize_claims,
            "bind": self._bind,
            "preempt": self._preempt,
        }

    # ---- verbs ------------------------------------------------------------------------------------
    def _filter(self, body: object) -> bytes:
        args, pod = self._args(ExtenderArgs, body)
        assert isinstance(args, ExtenderArgs)
        return encode_filter_result(self.server.service.filter(args, pod))

    def _prioritize(self, body: object) -> bytes:
        args, pod = self._args(ExtenderArgs, body)
        assert isinstance(args, ExtenderArgs)
        hosts, scores = self.server.service.prioritize(args, pod)
        return self.server.priorities.encode(hosts, scores)

    def _prioritize_claims(self, body: object) -> bytes:
        args, pod = self._args(ExtenderArgs, body)
        assert isinstance(args, ExtenderArgs)
        hosts, scores = self.server.service.prioritize_claims(args, pod)
        return self.server.priorities.encode(hosts, scores)

    def _bind(self, body: object) -> bytes:
        args = parse(ExtenderBindingArgs, body)
        error = clip(self.server.service.bind(args))  # it may quote the pod's own text
        self.server.metrics.bind_outcome("error" if error else "bound").inc()
        if error:
            LOG.info("bind %s/%s on %s refused: %s", args.PodNamespace, args.PodName, args.Node, error)
            return ExtenderBindingResult(Error=error).model_dump_json().encode()
        return BOUND

    def _preempt(self, body: object) -> bytes:
        args, pod = self._args(ExtenderPreemptionArgs, body)
        assert isinstance(args, ExtenderPreemptionArgs)
        return self.server.service.preempt(args, pod).model_dump_json().encode()

    def _args(
        self, model: type[ExtenderArgs] | type[ExtenderPreemptionArgs], body: object
    ) -> tuple[ExtenderArgs | ExtenderPreemptionArgs, Mapping[str, Any]]:
        raw = canonical_keys(body, model)
        checked = self.server.checked_pods
        if isinstance(raw, Mapping):
            pod = raw.get("Pod")
            kept = checked.match(pod)
            if kept is not None and isinstance(pod, dict):  # the pod filter checked: only the rest is new
                rest = {key: value for key, value in raw.items() if key != "Pod"}
                check_depth(rest)
                return parse(model, {**rest, "Pod": kept}), pod
            check_depth(raw)
        args = parse(model, body)
        assert isinstance(raw, Mapping)
        checked.keep(raw["Pod"], args.Pod)
        return args, raw["Pod"]

    # ---- plumbing ---------------------------------------------------------------------------------
    def _read_json(self) -> object:
        length = self.declared_length  # its framing was checked with the head
        if length is None:
            raise BadRequestError("missing Content-Length header")
        if length > MAX_BODY_BYTES:
            drained = self._drain(length)
            raise BadRequestError(
                f"request body is {length} bytes; the limit is {MAX_BODY_BYTES} "
                "(use nodeCacheCapable: true so kube-scheduler sends node names only)",
                close=not drained,
            )
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            raise BadRequestError(
                f"request body of {length} bytes did not arrive in time", close=True
            ) from None
        if len(body) < length:
            raise BadRequestError(f"request body ended after {len(body)} of {length} bytes", close=True)
        try:
            return decode_body(body)
        except (ValueError, RecursionError) as exc:
            raise BadRequestError(f"request body is not JSON: {exc}") from None

    def _drain(self, length: int) -> bool:
        """Read and drop a body we will not use, so the connection stays in sync. False if too big."""
        if length > MAX_DRAIN_BYTES:
            return False
        left = length
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                return False
            left -= len(chunk)
        return True

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        """Head and body leave in one write (one segment, one wake-up of the reader)."""
        if LOG.isEnabledFor(logging.DEBUG):
            self.log_request(status)
        close = "Connection: close\r\n" if self.close_connection else ""
        head = (
            f"{self.protocol_version} {status} {self.responses[status][0]}\r\n"
            f"Server: {self.version_string()}\r\nDate: {_DATE.now()}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n{close}\r\n"
        )
        self.wfile.write(head.encode("latin-1") + payload)
