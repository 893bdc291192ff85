"""One way to build a kubernetes ``ApiClient``: a kubeconfig, a service-account token, or in-cluster.

Each process builds its own ``ApiClient`` (never the kubernetes package's process-wide default),
so two components in one test process can talk to two API servers. A token file is read again
whenever the client refreshes its credentials, so a projected, rotated token keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from topology.errors import InvalidInputError


@dataclass(frozen=True)
class TokenAccess:
    """An API server reached with a bearer token from a file (a service account's, mounted or issued)."""

    server: str
    token_file: Path
    ca_file: Path | None = None


def _token_client(access: TokenAccess) -> client.ApiClient:
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
    return client.ApiClient(configuration)


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
        if kubeconfig:
            loaded: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig)
            )
            return loaded
        if token is not None:
            return _token_client(token)
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"cannot load Kubernetes credentials from {where}: {exc}; pass --kubeconfig or run in a pod"
        ) from None
    return client.ApiClient(configuration)
