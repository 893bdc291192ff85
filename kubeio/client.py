"""One way to build a kubernetes ``ApiClient``: a kubeconfig, a service-account token, or in-cluster.

Each process builds its own ``ApiClient`` (never the kubernetes package's process-wide default),
so two components in one test process can talk to two API servers. A token file is read again
whenever the client refreshes its credentials, so a projected, rotated token keeps working.

Every client keeps up to ``CONNECTIONS`` TLS connections to the API server open. The kubernetes
package's default pool (5 per CPU) is smaller than the binds kube-scheduler sends at once; urllib3
then opens a connection per call beyond the pool and closes it afterwards, and the TLS handshake
of each becomes the most expensive part of a bind on both sides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httptools
import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from devicemodel.errors import InvalidInputError

CONNECTIONS = 64  # pooled API server connections per client (see the module docstring)
AUTH_REFRESH_S = 60.0  # how often a ``Writer`` reads the client's credentials again
WRITE_TIMEOUT = urllib3.Timeout(connect=10.0, read=30.0)


@dataclass(frozen=True)
class TokenAccess:
    """An API server reached with a bearer token from a file (a service account's, mounted or issued)."""

    server: str
    token_file: Path
    ca_file: Path | None = None


def _token_configuration(access: TokenAccess) -> client.Configuration:
    configuration = client.Configuration()
    configuration.host = access.server
    if access.ca_file is not None:
        configuration.ssl_ca_cert = str(access.ca_file)
    else:
        configuration.verify_ssl = access.server.startswith("http://")

    def refresh(conf: Any) -> None:  # the client calls this before each request it authenticates
        conf.api_key["authorization"] = access.token_file.read_text().strip()

    refresh(configuration)
    configuration.api_key_prefix["authorization"] = "Bearer"
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
    return configuration


def api_client(kubeconfig: str | Path | None = None, *, token: TokenAccess | None = None) -> client.ApiClient:
    """A client from ``kubeconfig``, else from ``token``, else from the pod's own service account.

    Raises ``InvalidInputError`` naming the source when its credentials cannot be loaded."""
    where = (
        f"kubeconfig {kubeconfig}"
        if kubeconfig
        else f"token file {token.token_file}"
        if token
        else "the in-cluster service account"
    )
    try:
        if token is not None and not kubeconfig:
            configuration = _token_configuration(token)
        else:
            configuration = client.Configuration()
            if kubeconfig:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(kubeconfig), client_configuration=configuration
                )
            else:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"cannot load Kubernetes credentials from {where}: {exc}; pass --kubeconfig or run in a pod"
        ) from None
    configuration.connection_pool_maxsize = CONNECTIONS
    return client.ApiClient(configuration)


def finish(response: Any) -> bytes:
    """Read a raw (``_preload_content=False``) answer whole, which hands its connection back to
    the pool. An answer left unread keeps its connection, so the next call opens another one,
    with its own TLS handshake: what made every bind cost a handshake on both sides."""
    data: bytes = response.data
    return data


class Writer:
    """POSTs a JSON body to one API path through the client's own connection pool and
    credentials, for writes made once per scheduled pod (a Binding, an Event).

    The generated API methods validate their arguments, walk the body for serialization, rebuild
    the auth settings (running the kubeconfig's refresh hook) and wrap the answer, on every call:
    a third of the extender's CPU per bound pod went there. This sends the encoded body as is and
    reads the credentials again every ``AUTH_REFRESH_S`` (a rotated token is picked up within
    that time). A failure raises what the generated call would: ``ApiException`` with the status
    for an answer of 300 or more, urllib3's ``HTTPError`` when no answer came.

    The request is written on a kept-alive connection of the API server's own urllib3 pool
    (``exchange``): the request head is prepared once per credential refresh and sent with the body
    in one write, and the answer is parsed by httptools (llhttp, in C) instead of ``http.client``'s
    ``email``-based header parsing and urllib3's per-call request machinery, which were 14% of
    the extender's CPU per scheduled pod in a profiled end-to-end run. The pool keeps owning the
    connections (``ApiClient.close`` closes them). Behind a proxy, the pool manager's own request
    runs as before."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._host = str(api.configuration.host).rstrip("/")
        url = urllib3.util.parse_url(self._host)
        self._prefix = url.path or ""  # an API server behind a path
        self._authority = url.netloc or ""  # the Host field
        self._headers: dict[str, str] = {}
        self._head = b""  # the request head's fields, Host first, without Content-Length
        self._read_at = -AUTH_REFRESH_S
        self._lock = threading.Lock()
        self._pool: urllib3.HTTPConnectionPool | None = None

    def post(self, path: str, body: Mapping[str, Any]) -> bytes:
        payload = orjson.dumps(body)
        manager = self._api.rest_client.pool_manager
        if isinstance(manager, urllib3.ProxyManager):  # the proxy's own request rules apply
            response = manager.request(
                "POST",
                self._host + path,
                body=payload,
                headers=self._credentials()[0],
                timeout=WRITE_TIMEOUT,
                retries=False,
            )
            status, reason, data = response.status, response.reason or "", response.data
        else:
            fields = self._credentials()[1]
            head = b"".join(
                (
                    b"POST ",
                    _request_target(self._prefix + path),
                    b" HTTP/1.1\r\n",
                    fields,
                    b"Content-Length: %d\r\n\r\n" % len(payload),
                )
            )
            status, reason, data = self._post_pooled(manager, head + payload)
        if status >= 300:
            raise ApiException(status=status, reason=reason, body=data.decode(errors="replace"))
        return data

    def _post_pooled(self, manager: urllib3.PoolManager, request: bytes) -> tuple[int, str, bytes]:
        """The request on a connection of the API server's pool (looked up once, again if the
        manager closed it), then the connection back to the pool, or closed when the answer
        leaves it unusable."""
        for _ in range(2):
            pool = self._pool
            if pool is None:
                pool = self._pool = manager.connection_from_url(self._host)
            try:
                conn = pool._get_conn()
            except urllib3.exceptions.ClosedPoolError:
                self._pool = None
                continue
            try:
                status, reason, data, reusable = exchange(conn, request)
            except BaseException:
                conn.close()
                pool._put_conn(None)
                raise
            if not reusable:
                conn.close()
            pool._put_conn(conn if reusable else None)
            return status, reason, data
        raise urllib3.exceptions.ClosedPoolError(None, "the API server's connection pool was closed")  # type: ignore[arg-type]

    def _credentials(self) -> tuple[dict[str, str], bytes]:
        """The request's header fields, as a dict and as the encoded head (``Host`` first, without
        ``Content-Length``), read from the client again every ``AUTH_REFRESH_S``."""
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= AUTH_REFRESH_S:
                headers = {
                    **self._api.default_headers,
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                }
                for setting in self._api.configuration.auth_settings().values():
                    if setting.get("in") == "header" and setting.get("value"):
                        headers[str(setting["key"])] = str(setting["value"])
                self._head = _head_fields({"Host": self._authority, **headers, "Accept-Encoding": "identity"})
                self._headers, self._read_at = headers, now
            return self._headers, self._head


MAX_ANSWER_HEAD = 65_536  # bytes an answer may take before its header fields end
READ_SIZE = 65_536  # bytes asked of the socket per read


def _request_target(path: str) -> bytes:
    target = path.encode("ascii")  # as http.client: a path is ASCII (the callers quote names)
    if any(c <= 0x20 or c == 0x7F for c in target):
        raise ValueError(f"a request path may not hold spaces or control characters: {path!r}")
    return target


def _head_fields(fields: Mapping[str, str]) -> bytes:
    """``Name: value\\r\\n`` per field, refused (``ValueError``, as ``http.client``) when a name or
    value could end the field early."""
    lines = []
    for name, value in fields.items():
        if not name or any(c in name for c in ":\r\n \t") or any(c in value for c in "\r\n\0"):
            raise ValueError(f"invalid HTTP header field {name!r}")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(lines)


def exchange(conn: Any, request: bytes) -> tuple[int, str, bytes, bool]:
    """Write ``request`` (head and body) on a urllib3 connection, connecting it first if it is
    not, and read the whole answer with httptools' parser (llhttp, in C): (status, reason, body,
    whether the connection may serve the next request). The answer is framed by
    ``Content-Length``, by chunks, or (neither) by the end of the connection. Raises urllib3's
    ``ProtocolError`` (an ``HTTPError``) for an answer cut short or not HTTP, and its
    ``TimeoutError`` subclasses or ``OSError`` as the socket does."""
    if conn.sock is None:
        conn.timeout = WRITE_TIMEOUT.connect_timeout
        conn.connect()
    sock = conn.sock
    sock.settimeout(WRITE_TIMEOUT.read_timeout)
    try:
        sock.sendall(request)
        return read_answer(sock.recv)
    except TimeoutError as exc:
        raise urllib3.exceptions.ReadTimeoutError(None, "", f"the API server did not answer: {exc}") from None  # type: ignore[arg-type]


class _Answer:
    """httptools' callbacks for one answer; an interim 1xx answer (100 Continue) is dropped and
    the real one read after it."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.reason = ""
        self.body: list[bytes] = []
        self.framed = False  # Content-Length or Transfer-Encoding given: not ended by a close
        self.headers_done = False
        self.complete = False
        self.keep_alive = False

    def on_status(self, status: bytes) -> None:  # called again for each part the reads split it into
        self.reason += status.decode("latin-1")

    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        code = self.parser.get_status_code()
        if 100 <= code < 200 and code != 101:
            self.reason, self.body, self.framed, self.headers_done = "", [], False, False
            return
        self.keep_alive = self.parser.should_keep_alive()  # read now: the parser resets after this
        self.complete = True


def read_answer(recv: Callable[[int], bytes]) -> tuple[int, str, bytes, bool]:
    """One HTTP/1.x answer from ``recv`` (a socket's): see ``exchange``."""
    answer = _Answer()
    parser, head = answer.parser, 0
    while not answer.complete:
        data = recv(READ_SIZE)
        if not data:
            if answer.headers_done and not answer.framed:  # framed by the connection's end
                return parser.get_status_code(), answer.reason, b"".join(answer.body), False
            raise urllib3.exceptions.ProtocolError("the API server closed the connection mid-answer")
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise urllib3.exceptions.ProtocolError(f"the API server's answer is not HTTP: {exc}") from None
        if not answer.headers_done:
            head += len(data)
            if head > MAX_ANSWER_HEAD:
                raise urllib3.exceptions.ProtocolError(
                    f"the API server's answer has over {MAX_ANSWER_HEAD} bytes of header fields"
                )
    return parser.get_status_code(), answer.reason, b"".join(answer.body), answer.keep_alive
