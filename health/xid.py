"""The Xid policy: what one Xid means for one GPU family, and which action it grades to.

Pure data and lookups (no I/O). The default table follows NVIDIA's Xid catalog (immediate and
investigatory buckets) and settles the places where the catalog, the device plugin, DCGM and the
EKS agent disagree, per GPU generation:

- 63/64 mean page retirement before Ampere and row remapping from Ampere on: a new remapped row
  needs a GPU reset (Ampere+), a new retired page only a driver reload we leave to the operator.
- 93 applies to Volta only; 121 (C2C) to Grace parts only; 144-150 (NVLink5) to Blackwell and
  are graded by the ``Fatal``/``Nonfatal`` token the kernel line carries.
- 94 is contained to the application (catalog RESTART_APP), 109 is a GPU reset (catalog), both
  unlike the NVIDIA device plugin's static list.
- An Xid we do not know withholds the device (fail closed) without evicting anything.

Operators override any entry per family through the health configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum

from devicemodel.inventory import Architecture


class Severity(StrEnum):
    """How a signal affects the device it is attributed to."""

    IGNORED = "ignored"  # not applicable or harmless: log only
    INFORMATIONAL = "informational"  # recorded and counted, no device action
    APPLICATION = "application"  # the application's fault: the job restarts, the device stays
    SUSPECT = "suspect"  # withhold from new work until checks pass again
    FATAL = "fatal"  # the device failed: evict its pods and remediate


class Action(StrEnum):
    """Graded remediation steps, mildest first."""

    NONE = "none"
    RESET_GPU = "reset-gpu"
    RECREATE_MIG = "recreate-mig"
    REBOOT_NODE = "reboot-node"
    REPLACE = "replace"


class Cause(StrEnum):
    """Who a fault is charged to in availability and job-impact counters."""

    HARDWARE = "hardware"
    DRIVER = "driver"
    PLATFORM = "platform"
    USER = "user"


UNKNOWN_XID = 999  # NVML reports eventData 999 for an Xid it does not know


@dataclass(frozen=True)
class XidRule:
    """The graded response to one Xid: severity, remediation ladder, who is to blame.

    ``ladder`` is tried in order, one step per failed remediation attempt; ``strike`` says whether
    the failure counts towards the bad-hardware list (a successful row remap does not).
    """

    xid: int
    name: str
    severity: Severity
    cause: Cause
    ladder: tuple[Action, ...] = ()
    strike: bool = True


def _app(xid: int, name: str, cause: Cause = Cause.USER) -> XidRule:
    return XidRule(xid, name, Severity.APPLICATION, cause, strike=False)


def _info(xid: int, name: str, cause: Cause = Cause.HARDWARE) -> XidRule:
    return XidRule(xid, name, Severity.INFORMATIONAL, cause, strike=False)


def _fatal(xid: int, name: str, cause: Cause, *ladder: Action, strike: bool = True) -> XidRule:
    return XidRule(xid, name, Severity.FATAL, cause, ladder or (Action.RESET_GPU, Action.REPLACE), strike)


_R, _B, _X = Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE
_HW, _DRV, _PLAT = Cause.HARDWARE, Cause.DRIVER, Cause.PLATFORM

COMMON_RULES: tuple[XidRule, ...] = (
    _app(8, "IDLE_TIMEOUT", _DRV),
    _app(13, "GR_EXCEPTION"),
    _app(31, "MMU_ERR_FLT"),
    _app(32, "PBDMA_ERROR"),
    _info(38, "FECS_ERR_WATCHDOG_TIMEOUT", _DRV),
    _app(43, "RESETCHANNEL_VERIF"),
    _app(45, "PREEMPTIVE_REMOVAL"),
    _fatal(46, "GPU_TIMEOUT_ERROR", _DRV),
    _fatal(48, "GPU_ECC_DBE", _HW),
    _fatal(54, "PWR_REDUCED_CLOCKING", _HW, _X),
    _info(61, "PMU_BREAKPOINT", _DRV),
    _fatal(62, "PMU_HALT_ERROR", _DRV),
    _info(63, "DRAM_PAGE_RETIREMENT_EVENT"),  # pre-Ampere: a driver reload activates it
    _fatal(64, "DRAM_RETIREMENT_FAILURE", _HW, _X),
    _app(68, "NVDEC0_EXCEPTION"),
    _app(69, "GR_CLASS_ERROR"),
    _fatal(74, "NVLINK_ERROR", _HW),
    _fatal(79, "GPU_HAS_FALLEN_OFF_THE_BUS", _HW, _R, _B, _X),
    _info(92, "EXCESSIVE_SBE_INTERRUPTS"),
    XidRule(93, "INFOROM_ERASE_LIMIT_EXCEEDED", Severity.IGNORED, _HW, strike=False),
    _fatal(109, "CTXSW_TIMEOUT_ERROR", _DRV),
    _fatal(110, "SEC_FAULT_ERROR", _DRV),
    _fatal(119, "GSP_RPC_TIMEOUT", _DRV, _R, _B, _X),
    _fatal(120, "GSP_ERROR", _DRV, _R, _B, _X),
    XidRule(121, "C2C_ERROR", Severity.IGNORED, _HW, strike=False),
    _info(123, "SPI_PMU_RPC_WRITE_FAIL", _DRV),
    _fatal(136, "ALI_TRAINING_FAIL", _HW),
    _app(137, "NVLINK_PRIV_ERR"),
    _fatal(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", _HW),
    _fatal(143, "GPU_INIT_ERROR", _HW),
    _fatal(151, "KEY_ROTATION_ERROR", _PLAT, _B),
    _info(154, "GPU_RECOVERY_ACTION_CHANGED", _DRV),
    _fatal(155, "NVLINK_SW_DEFINED_ERROR", _DRV),
    _fatal(156, "RESOURCE_RETIREMENT_EVENT", _HW, strike=False),
    _info(157, "RESOURCE_RETIREMENT_FAILURE"),
    _fatal(158, "GPU_FATAL_TIMEOUT", _HW),
    _app(159, "CHI_NON_DATA_ERROR", _DRV),
    _info(160, "CHANNEL_RETIREMENT_EVENT", _DRV),
    _info(161, "CHANNEL_RETIREMENT_FAILURE", _DRV),
    _fatal(162, "POWER_SMOOTHING_ERROR", _HW),
    _fatal(171, "UNCORRECTABLE_DRAM_ERROR", _HW),
    _fatal(172, "UNCORRECTABLE_SRAM_ERROR", _HW),
)

_ERROR_CONTAINMENT = frozenset(
    {Architecture.AMPERE, Architecture.ADA, Architecture.HOPPER, Architecture.BLACKWELL}
)

# Overrides on top of COMMON_RULES, per family.
VOLTA_RULES: tuple[XidRule, ...] = (_info(93, "INFOROM_ERASE_LIMIT_EXCEEDED"),)
ROW_REMAP_RULES: tuple[XidRule, ...] = (
    _fatal(63, "ROW_REMAP_PENDING", _HW, _R, _X, strike=False),  # a reset activates the remap
    _app(94, "CONTAINED_ERROR", _HW),
    _fatal(95, "UNCONTAINED_ERROR", _HW),
)
BLACKWELL_RULES: tuple[XidRule, ...] = tuple(
    _fatal(xid, f"NVLINK5_{unit}", _HW)
    for xid, unit in zip(
        range(144, 151), ("SAW", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE"), strict=True
    )
)
GRACE_RULES: tuple[XidRule, ...] = (_info(121, "C2C_ERROR"),)

UNKNOWN_RULE = XidRule(UNKNOWN_XID, "UNKNOWN", Severity.SUSPECT, Cause.HARDWARE, strike=False)


@dataclass(frozen=True)
class XidOverride:
    """An operator's change to one Xid's rule (any field left None keeps the default)."""

    xid: int
    severity: Severity | None = None
    ladder: tuple[Action, ...] | None = None
    cause: Cause | None = None


@dataclass(frozen=True)
class XidTable:
    """Rules for one GPU family, built once per GPU from the defaults and the overrides."""

    rules: Mapping[int, XidRule]
    boot_ignored: frozenset[int] = frozenset()

    def rule(self, xid: int, *, at_boot: bool = False, nonfatal_hint: bool = False) -> XidRule:
        """The rule for ``xid``; allow-listed boot Xids and Nonfatal-marked ones are informational."""
        found = self.rules.get(xid)
        if found is None:
            return replace(UNKNOWN_RULE, xid=xid)
        if (at_boot and xid in self.boot_ignored) or (nonfatal_hint and found.severity is Severity.FATAL):
            return replace(found, severity=Severity.INFORMATIONAL, strike=False)
        return found


def table_for(
    architecture: Architecture,
    *,
    grace: bool = False,
    overrides: Iterable[XidOverride] = (),
    boot_ignored: Iterable[int] = (),
) -> XidTable:
    """The Xid table of one GPU family (``grace`` for GH200/GB200-class parts)."""
    rules = {r.xid: r for r in COMMON_RULES}
    layers: list[tuple[XidRule, ...]] = []
    if architecture is Architecture.VOLTA:
        layers.append(VOLTA_RULES)
    if architecture in _ERROR_CONTAINMENT:
        layers.append(ROW_REMAP_RULES)
    if architecture is Architecture.BLACKWELL:
        layers.append(BLACKWELL_RULES)
    if grace:
        layers.append(GRACE_RULES)
    for layer in layers:
        rules.update({r.xid: r for r in layer})
    for change in overrides:
        base = rules.get(change.xid, replace(UNKNOWN_RULE, xid=change.xid))
        rules[change.xid] = replace(
            base,
            severity=change.severity or base.severity,
            ladder=base.ladder if change.ladder is None else change.ladder,
            cause=change.cause or base.cause,
        )
    return XidTable(rules=rules, boot_ignored=frozenset(boot_ignored))


def is_grace_part(product: str) -> bool:
    """GH200/GB200/GB300 superchips pair the GPU with a Grace CPU over C2C."""
    upper = product.upper()
    return any(tag in upper for tag in ("GH200", "GB200", "GB300"))


class RecoveryAction(IntEnum):
    """``nvmlDeviceGpuRecoveryAction_t``: what the driver says the GPU needs (Xid 154, field 230)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


def recovery_rule(action: int) -> XidRule:
    """The graded response to a recovery action; it always concerns the whole GPU, MIG devices included.

    Reset-class actions fail the GPU with a reset ladder, reboot-class ones with a reboot ladder,
    a P2P drain withholds it, and an IMEX-domain recovery does not concern GPU scheduling.
    """
    name = RecoveryAction(action).name if action in RecoveryAction._value2member_map_ else f"ACTION_{action}"
    if action in (RecoveryAction.GPU_RESET, RecoveryAction.DRAIN_AND_RESET, RecoveryAction.BUS_RESET):
        return XidRule(154, f"RECOVERY_{name}", Severity.FATAL, Cause.DRIVER, (_R, _B, _X), strike=True)
    if action in (RecoveryAction.NODE_REBOOT, RecoveryAction.SYSTEM_REBOOT):
        return XidRule(154, f"RECOVERY_{name}", Severity.FATAL, Cause.DRIVER, (_B, _X), strike=True)
    if action == RecoveryAction.DRAIN_P2P:
        return XidRule(154, f"RECOVERY_{name}", Severity.SUSPECT, Cause.DRIVER, strike=False)
    if action in (RecoveryAction.NONE, RecoveryAction.RECOVER_IMEX_DOMAIN):
        return XidRule(154, f"RECOVERY_{name}", Severity.INFORMATIONAL, Cause.DRIVER, strike=False)
    return XidRule(
        154, f"RECOVERY_{name}", Severity.SUSPECT, Cause.DRIVER, strike=False
    )  # unknown: fail closed
