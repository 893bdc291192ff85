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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from topology.errors import InvalidInputError

CONNECTIONS = 64  # pooled API server connections per client (see the module docstring)


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

