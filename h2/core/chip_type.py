"""A cluster file's chip type (one entry of `chips:`) and its `emulation:` section, validated on load.

    chips:
      - name: emu-slow
        count: 2
        memory_gb: 0.08            # the emulated capacity: allocations past it raise OutOfMemoryError
        chips_per_node: 2
        intra_node_gbps: 2         # default bandwidth between two chips of one node (GB/s)
        inter_node_gbps: 1         # default bandwidth between two nodes of this type (GB/s)
        latency_us: 50             # default one-way latency of its links
        site: north                # the site its nodes sit in, where the file has no `nodes` section
        provenance: "spec sheet: <source>"   # or "measured: <source>" (optional)
        emulation:                 # what its DIPU vendor emulates (h2.core.emulation): host or opencl
          relative_speed: 0.05
          precision: fp32
          host_accessible: false
        vendor: opencl             # its ranks run on the dipu device of this DIPU vendor (DIPU_VENDOR): host or
                                   # opencl; without it: the job's device (an emulated chip: dipu, host vendor)

Sizes: memory in GB (10^9 bytes), bandwidths in GB/s, latency in microseconds, TFLOPS in 10^12/s.

A leaf: imports only h2.core.errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from h2.core.errors import UserError

PROVENANCE_KINDS = ("spec sheet: ", "measured: ")
# The DIPU vendors a chip type may name (ditorch.dipu.vendor: DIPU_VENDOR); both emulate a chip's speed and
# memory, only the host vendor its precision and host access.
CHIP_VENDORS = ("host", "opencl")
EMULATING_VENDOR = "host"


def check_range(value: float, low: float, high: float, where: str, name: str) -> None:
    """One line naming the field when a number is not finite or lies outside [low, high]."""
    if low == 0 and value < 0:
        raise UserError(f"{where}: field '{name}' must not be negative, got {value}")
    if low > 0 and value <= 0:
        raise UserError(f"{where}: field '{name}' must be positive, got {value}")
    if not (math.isfinite(value) and low <= value <= high):
        raise UserError(f"{where}: field '{name}' must be between {low:g} and {high:g}, got {value}")


@dataclass(frozen=True)
class ChipEmulation:
    """A chip type's `emulation:` section (the trust rule and the host vendor: h2.core.emulation)."""
    relative_speed: float  # (0, 1]: the chip's rate as a fraction of one host core
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    host_accessible: bool = False

    def validate(self, where: str) -> None:
        if not 0 < self.relative_speed <= 1:
            raise UserError(f"{where}: field 'emulation.relative_speed' must be in (0, 1] (a fraction of one host "
                            f"core), got {self.relative_speed}")


@dataclass(frozen=True)
class ChipType:
    name: str
    count: int
    memory_gb: float
    chips_per_node: int
    tp_max: int
    intra_node_gbps: float
    inter_node_gbps: float
    latency_us: float = 10.0
    usable_memory_fraction: float = 0.9
    peak_tflops: float | None = None
    achievable_fraction: float = 0.45
    tp_efficiency_per_doubling: float = 1.0
    memory_bandwidth_gbps: float = 1600.0
    emulated: bool = False
    emulation: ChipEmulation | None = None  # what the DIPU host vendor emulates (h2.core.emulation)
    site: str | None = None  # the site its nodes sit in (h2.core.links); None: the default
    provenance: str | None = None  # where its numbers come from: "spec sheet: <source>" or "measured: <source>"
    vendor: str | None = None  # the DIPU vendor its ranks load (CHIP_VENDORS); None: the host's, on the job's device

    # bounds: every count, size and rate finite and inside what hardware spans, so no sum overflows
    RANGES = {
        "count": (1, 1 << 24), "chips_per_node": (1, 1 << 16), "tp_max": (1, 1 << 10), "memory_gb": (1e-6, 1e6),
        "intra_node_gbps": (1e-6, 1e9), "inter_node_gbps": (1e-6, 1e9), "memory_bandwidth_gbps": (1e-6, 1e9),
        "latency_us": (0.0, 1e9), "usable_memory_fraction": (1e-9, 1.0), "achievable_fraction": (1e-9, 1.0),
        "tp_efficiency_per_doubling": (1e-9, 1.0)
    }

    def validate(self, source: str) -> None:
        where = f"{source}: chip '{self.name}'"
        self.validate_vendor(where)
        if self.emulation is not None:
            if not self.emulated:
                raise UserError(f"{where}: field 'emulated' is false but the chip has an 'emulation' section")
            self.emulation.validate(where)
        for name, (low, high) in self.RANGES.items():
            check_range(getattr(self, name), low, high, where, name)
        if self.peak_tflops is not None:
            check_range(self.peak_tflops, 1e-9, 1e9, where, "peak_tflops")
        if self.provenance is not None and not (isinstance(self.provenance, str)
                                                and self.provenance.startswith(PROVENANCE_KINDS)):
            raise UserError(f"{where}: field 'provenance' must start with 'spec sheet: ' or 'measured: ', "
                            f"got {self.provenance!r}")
        if self.site is not None and not (isinstance(self.site, str) and self.site):
            raise UserError(f"{where}: field 'site' must name a site, got {self.site!r}")
        if self.tp_max & (self.tp_max - 1):
            raise UserError(f"{where}: field 'tp_max' must be a power of two, got {self.tp_max}")
        if self.tp_max > self.chips_per_node:
            raise UserError(f"{where}: field 'tp_max' ({self.tp_max}) exceeds chips_per_node ({self.chips_per_node}): "
                            "tensor parallelism stays inside a node")

    def validate_vendor(self, where: str) -> None:
        if self.vendor is not None and self.vendor not in CHIP_VENDORS:
            raise UserError(f"{where}: field 'vendor' must be one of {', '.join(CHIP_VENDORS)}, got {self.vendor!r}")
        if self.emulation is None or self.dipu_vendor == EMULATING_VENDOR:
            return
        if self.emulation.precision != "fp32":
            raise UserError(f"{where}: field 'emulation.precision' is {self.emulation.precision!r} but the chip's "
                            f"vendor is {self.vendor!r}: only the {EMULATING_VENDOR} vendor emulates a precision "
                            "(the opencl vendor emulates speed and memory)")
        if self.emulation.host_accessible:
            raise UserError(f"{where}: field 'emulation.host_accessible' is true but the chip's vendor is "
                            f"{self.vendor!r}, whose device memory the CPU cannot touch")

    @property
    def dipu_vendor(self) -> str:
        """The DIPU vendor its ranks load: the one it names, else the host vendor."""
        return self.vendor or EMULATING_VENDOR

    @property
    def on_dipu(self) -> bool:
        """Whether its stages run on the dipu device: an emulated chip, or one that names its DIPU vendor."""
        return self.emulation is not None or self.vendor is not None

    @property
    def capacity_bytes(self) -> float:
        return self.memory_gb * 1e9 * self.usable_memory_fraction

    def tp_compute_efficiency(self, tp: int) -> float:
        """Fraction of the achievable rate kept at TP size tp (smaller GEMMs, exposed collectives)."""
        return self.tp_efficiency_per_doubling**(tp.bit_length() - 1)

    def tp_sizes(self) -> list[int]:
        sizes, tp = [], 1
        while tp <= self.tp_max:
            sizes.append(tp)
            tp *= 2
        return sizes
