"""Errors of the device plugin; all derive from ``GpuweaveError``."""

from __future__ import annotations

from devicemodel.errors import GpuweaveError, InvalidInputError


class DevicePluginError(GpuweaveError):
    """The node agent could not serve, register or publish."""


class AllocationRejectedError(InvalidInputError):
    """A kubelet request names devices or sizes we cannot honour (gRPC INVALID_ARGUMENT)."""


class ControlError(GpuweaveError):
    """A control-socket request failed; ``code`` says whether the caller or the agent is at fault."""

    def __init__(self, message: str, *, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code
