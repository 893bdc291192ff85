"""Errors of the device plugin; all derive from ``GpuweaveError``."""

from __future__ import annotations

from devicemodel.errors import AllocationRejectedError, GpuweaveError


class DevicePluginError(GpuweaveError):
    """The node agent could not serve, register or publish."""


class ControlError(GpuweaveError):
    """A control-socket request failed; ``code`` says whether the caller or the agent is at fault."""

    def __init__(self, message: str, *, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


__all__ = ["AllocationRejectedError"]
