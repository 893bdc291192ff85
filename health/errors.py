"""Errors raised by the health package."""

from __future__ import annotations

from devicemodel.errors import GpuweaveError


class HealthError(GpuweaveError):
    """Base of health errors."""


class HealthStateError(HealthError):
    """Persisted health state (bad-hardware list, kernel-log cursor) cannot be read or written."""


class HealthConfigError(HealthError):
    """The health configuration is invalid."""


class ActiveCheckBusyError(HealthError):
    """An active check is already running on this node (one run at a time)."""
