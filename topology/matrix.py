"""A topology matrix in the style of ``nvidia-smi topo -m``, as values plus a text rendering.

The graph produces the values; the CLI prints them with ``to_text`` or serialises ``to_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass

_LEGEND = (
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the interconnect between NUMA nodes",
    "  NODE = Connection traversing PCIe and the interconnect between host bridges in a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks (directly or through NVSwitches)",
)


@dataclass(frozen=True)
class MatrixRow:
    name: str  # "GPU0" or "NIC3"
    cells: tuple[str, ...]  # one label per column of the matrix
    numa_affinity: str


@dataclass(frozen=True)
class TopologyMatrix:
    columns: tuple[str, ...]  # GPU0..GPUn then NIC0..NICm
    rows: tuple[MatrixRow, ...]
    nic_legend: tuple[tuple[str, str], ...]  # ("NIC0", "rdmap16s27")

    def cell(self, row: str, column: str) -> str:
        for matrix_row in self.rows:
            if matrix_row.name == row:
                return matrix_row.cells[self.columns.index(column)]
        raise KeyError(f"topology matrix has no row {row!r}; rows are {[r.name for r in self.rows]}")

    def to_text(self) -> str:
        """The table, the link legend and the NIC legend, laid out as nvidia-smi does."""
        header = ["", *self.columns, "NUMA Affinity"]
        body = [[row.name, *row.cells, row.numa_affinity] for row in self.rows]
        widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                 for line in [header, *body]]
        lines += ["", "Legend:", "", *_LEGEND]
        if self.nic_legend:
            lines += ["", "NIC Legend:", ""] + [f"  {short}: {name}" for short, name in self.nic_legend]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "columns": list(self.columns),
            "rows": [{"name": r.name, "cells": list(r.cells), "numaAffinity": r.numa_affinity}
                     for r in self.rows],
            "nicLegend": {short: name for short, name in self.nic_legend},
        }
