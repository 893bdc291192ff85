"""Request decoding under the agent's control, for both front ends' gRPC services (the device
plugin's ``deviceplugin.server`` and the DRA kubelet plugin's ``dradriver.plugin``): a request
whose bytes do not decode gets INVALID_ARGUMENT with the reason, never gRPC's INTERNAL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message


def decoding_handler(
    message_type: type[Message], method: Callable[[Any, grpc.ServicerContext], Any]
) -> Callable[[bytes, grpc.ServicerContext], Any]:
    """Wrap an RPC so undecodable request bytes get INVALID_ARGUMENT instead of INTERNAL."""

    def handler(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = message_type.FromString(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {message_type.__name__}: {exc}")
        return method(request, context)

    return handler
