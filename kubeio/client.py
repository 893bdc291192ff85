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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    for an answer of 300 or more, urllib3's ``HTTPError`` when no answer came."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._host = str(api.configuration.host).rstrip("/")
        self._prefix = urllib3.util.parse_url(self._host).path or ""  # an API server behind a path
        self._headers: dict[str, str] = {}
        self._read_at = -AUTH_REFRESH_S
        self._lock = threading.Lock()
        self._pool: urllib3.HTTPConnectionPool | None = None

    def post(self, path: str, body: Mapping[str, Any]) -> bytes:
        payload, headers = orjson.dumps(body), self._current_headers()
        manager = self._api.rest_client.pool_manager
        if isinstance(manager, urllib3.ProxyManager):  # the proxy's own request rules apply
            response = manager.request(
                "POST", self._host + path, body=payload, headers=headers, timeout=WRITE_TIMEOUT, retries=False
            )
        else:
            response = self._post_pooled(manager, self._prefix + path, payload, headers)
        data: bytes = response.data  # read whole: the connection goes back to the pool
        if response.status >= 300:
            raise ApiException(
                status=response.status, reason=response.reason, body=data.decode(errors="replace")
            )
        return data

    def _post_pooled(
        self, manager: urllib3.PoolManager, path: str, payload: bytes, headers: dict[str, str]
    ) -> urllib3.BaseHTTPResponse:
        """The request on the API server's connection pool itself: the pool manager's URL parsing,
        pool lookup and header merging per call were about 14% of a bind's CPU in a profiled run.
        A pool the manager has since closed (evicted) is looked up again."""
        for _ in range(2):
            pool = self._pool
            if pool is None:
                pool = self._pool = manager.connection_from_url(self._host)
            try:
                return pool.urlopen(
                    "POST",
                    path,
                    body=payload,
                    headers=headers,
                    timeout=WRITE_TIMEOUT,
                    retries=False,
                    redirect=False,
                    assert_same_host=False,
                    preload_content=True,
                )
            except urllib3.exceptions.ClosedPoolError:
                self._pool = None
        raise urllib3.exceptions.ClosedPoolError(None, "the API server's connection pool was closed")  # type: ignore[arg-type]

    def _current_headers(self) -> dict[str, str]:
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
                self._headers, self._read_at = headers, now
            return self._headers
