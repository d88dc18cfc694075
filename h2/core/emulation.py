"""Emulated chips: what a cluster file's `emulation:` section of a chip type means (the section itself
is h2.core.chip_type.ChipEmulation), and the rule that keeps measured times honest on a small host.

    chips:
      - name: emu-slow
        memory_gb: 0.08            # the emulated capacity: allocations past it raise OutOfMemoryError
        ...
        emulation:
          relative_speed: 0.05     # kernels take 1/0.05 = 20x the host core's work time
          precision: fp32          # fp32 | tf32 | bf16: mantissa bits kept in matmul outputs
          host_accessible: false   # the CPU cannot touch device memory (copies go through the vendor)

A rank of a stage whose chip type has this section runs on the dipu device, whose host vendor
emulates the chip (h2.cli.rank sets it up before the device opens): each kernel is held until the
CPU time its thread spent, divided by `relative_speed`, has passed, and `memory_gb` bounds the
device memory. A chip type with `vendor: opencl` is emulated by the OpenCL vendor on its OpenCL device
instead: a kernel's run time on that device (its profiling timestamps), divided by `relative_speed`,
and `memory_gb` bounding the device's memory (fp32 and host_accessible false only).

**The trust rule.** A kernel is late (its time depends on the host, not on the chip) only when its
thread waits for a core longer than the slack it has, (1 / speed - 1) x its own work. Ranks of a
chip at speed s keep a core busy a fraction s of the time, plus a little unpaced host work
(Python, autograd, copies). So the emulation is trusted while the ranks on one host claim at most
CORE_SHARE_LIMIT of its cores: sum over ranks of relative_speed <= CORE_SHARE_LIMIT x cores (a rank
of a chip without emulation runs at host speed and counts 1). The cost: an emulated chip runs at a
fraction of a host core, so a run of N ranks on C cores is about N / (CORE_SHARE_LIMIT x C) times
slower than the host could go. `check_core_share` refuses a job that breaks the rule, in one line.

**INVALID measurements.** The rule is checked before a job starts; what the host really gave is measured
while it runs: the time its kernels ran late (the host vendor's pacing counters, stage_report.json's
`overrun_s` over `emulated_s`) and the time paced steps overran their target (h2.train.pacing). A
measurement whose late or overrun time exceeds UNTRUSTED_FRACTION (5 %) of its measured time depends on
the host's load, not on the emulated chips: `measurement_trust` is the one verdict every reader of such
a measurement uses (the closed-loop benchmarks print INVALID and exit 3 instead of PASS/FAIL,
`heteroauto profile` refuses to write the profile unless --force, `h2 check` marks the run INVALID).

**PACING_REVISION** names how the vendors charge an emulated kernel (the host vendor: the least CPU time its
thread spent on the same kernel, divided by the speed; the OpenCL vendor: the device's own time, divided by
the speed) and what counts as late. A profile of an emulated chip is measured under one revision and is
stale under another (heteroauto.profiles.profile_fingerprint): change it whenever either rule changes.

Pure Python; imports h2.core.errors and chip_type (and, for types, cluster and strategy: never the reverse).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from h2.core.chip_type import EMULATING_VENDOR, ChipEmulation, ChipType
from h2.core.errors import UserError

if TYPE_CHECKING:
    from h2.core.cluster import ClusterSpec
    from h2.core.strategy import Strategy

__all__ = [
    "CORE_SHARE_LIMIT", "PACING_REVISION", "UNTRUSTED_FRACTION", "MeasurementTrust", "measurement_trust",
    "stage_report_trust", "EMULATED_DEVICE", "ChipEmulation", "busy_host_warning", "check_core_share", "core_share",
    "describe_chip", "emulated_stage_devices", "host_cores", "host_vendor_settings", "host_work_warning", "rank_chips",
    "rank_wait_environment"
]

CORE_SHARE_LIMIT = 0.5
PACING_REVISION = "2026-11 warm CPU time"  # csrc/dipu/vendor/host (kernel charge), csrc/dipu/vendor/opencl (pacing)
# A measurement is INVALID when the time the host made late (late kernel time, pacing overruns) is more
# than this fraction of the time measured (emulated kernel time, paced step time): the one threshold.
UNTRUSTED_FRACTION = 0.05
# Mantissa bits a precision keeps in matmul outputs (fp32 keeps all 23: no rounding).
MANTISSA_BITS = {"fp32": 23, "tf32": 10, "bf16": 7}
MATMUL_KERNELS = ("diopiMm", "diopiBmm", "diopiAddmm")
EMULATED_DEVICE = "dipu"


@dataclass(frozen=True)
class MeasurementTrust:
    """How much of a measurement the host's load decided: `late_s` of its `measured_s` (`what` names the
    measured time, e.g. 'emulated kernel time')."""
    late_s: float
    measured_s: float
    what: str

    @property
    def fraction(self) -> float:
        return self.late_s / self.measured_s if self.measured_s > 0 else 0.0

    @property
    def trusted(self) -> bool:
        return self.fraction <= UNTRUSTED_FRACTION

    def describe(self) -> str:
        """'trusted: 0.4% of the emulated kernel time late (limit 5%)' or 'INVALID: ...'."""
        verdict = "trusted" if self.trusted else "INVALID"
        reason = "" if self.trusted else ": it measured the host's load, not the emulated chips"
        return (
            f"{verdict}: {self.fraction:.1%} of the {self.what} late ({self.late_s:.3f} of {self.measured_s:.3f} s; "
            f"limit {UNTRUSTED_FRACTION:.0%}){reason}")


def measurement_trust(late_s: float, measured_s: float, what: str = "emulated kernel time") -> MeasurementTrust:
    """The verdict on a measurement of which the host made `late_s` of `measured_s` seconds late."""
    return MeasurementTrust(float(late_s), float(measured_s), what)


def stage_report_trust(rows: list[dict]) -> MeasurementTrust:
    """The verdict on a run from its stage report (stage_report.json): late kernel time over emulated
    kernel time, summed over its stages (a run without emulated kernels is trusted)."""
    return measurement_trust(sum(row.get("overrun_s") or 0.0 for row in rows),
                             sum(row.get("emulated_s") or 0.0 for row in rows))


def describe_chip(chip: ChipType) -> str:
    """How a chip type appears in outputs: 'emu-slow (emulated: 0.05x a host core, 80 MB)'; on the
    OpenCL vendor 'emu-cl (emulated on opencl: 0.05x its OpenCL device, 80 MB)'."""
    if chip.emulation is None:
        return chip.name if chip.vendor is None else f"{chip.name} (dipu, {chip.vendor} vendor)"
    if chip.dipu_vendor != EMULATING_VENDOR:
        return (f"{chip.name} (emulated on {chip.dipu_vendor}: {chip.emulation.relative_speed:g}x its OpenCL device, "
                f"{chip.memory_gb * 1e3:g} MB)")
    return (
        f"{chip.name} (emulated: {chip.emulation.relative_speed:g}x a host core, "
        f"{chip.memory_gb * 1e3:g} MB{'' if chip.emulation.precision == 'fp32' else ', ' + chip.emulation.precision})")


def host_vendor_settings(chip: ChipType) -> dict:
    """The settings the DIPU host vendor (csrc/dipu/vendor/host) emulates `chip` with, one device per rank
    (written as the vendor's profile file, DIPU_HOST_PROFILE: not a planner's profile). The OpenCL vendor
    takes its memory_capacity and relative_speed (ditorch.dipu.emulation)."""
    emulation = chip.emulation
    settings = {
        "name": chip.name, "description": f"emulated chip {chip.name}", "device_count": 1, "memory_capacity": str(
            int(chip.memory_gb * 1e9)), "relative_speed": emulation.relative_speed,
        "host_accessible": emulation.host_accessible
    }
    if emulation.precision != "fp32":
        settings["round_output_ops"] = list(MATMUL_KERNELS)
        settings["round_output_mantissa_bits"] = MANTISSA_BITS[emulation.precision]
    return settings


def rank_wait_environment() -> dict[str, str]:
    """What a rank of an emulated chip sets before its collectives start: its waits sleep instead of
    spinning (DiComm's DICOMM_SPIN_US=0). An emulated chip's time is its kernels' CPU time over its
    speed, so a rank must leave the cores alone while it waits: a waiter that spins takes the core a
    peer's kernels (or the peer it waits for) need, and on 2 cores the TP ranks of one stage spent
    most of their CPU in sched_yield (docs/emulation.md)."""
    return {"DICOMM_SPIN_US": "0"}


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity), the budget of the trust rule."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def core_share(chip: ChipType) -> float:
    """Fraction of a host core one rank of `chip` keeps busy: its emulated speed, or 1 at host speed."""
    return chip.emulation.relative_speed if chip.emulation is not None else 1.0


def check_core_share(chips: list[ChipType], cores: int, where: str, what: str = "ranks on this host") -> None:
    """The trust rule over the ranks of one host, one chip type each: one line naming `where` when broken."""
    claimed = sum(core_share(chip) for chip in chips)
    allowed = CORE_SHARE_LIMIT * cores
    if claimed > allowed + 1e-9:
        counts: dict[str, int] = {}
        for chip in chips:
            counts[chip.name] = counts.get(chip.name, 0) + 1
        by_chip = {chip.name: chip for chip in chips}
        terms = " + ".join(f"{n} x {core_share(by_chip[name]):g} ({name})" for name, n in counts.items())
        emulated = any(chip.emulation for chip in chips)
        field = "field 'emulation.relative_speed'" if emulated else "chips without emulation (a host core per rank)"
        remedy = "lower the speeds or run fewer ranks here" if emulated else "run fewer ranks here"
        raise UserError(f"{where}: {field}: the {len(chips)} {what} claim {claimed:.3g} "
                        f"cores ({terms}), more than {CORE_SHARE_LIMIT:g} x {cores} host cores = {allowed:.3g}: "
                        f"{'emulated' if emulated else 'measured'} times would depend on the host's load; {remedy}")


def busy_host_warning(chips: list[ChipType], cores: int) -> str | None:
    """A warning when other processes already keep this host's cores busy (its 1-minute load average),
    so that the emulated chips may get less than their share: the rule covers the job's own ranks
    only, and a late kernel is counted (stage_report.json) rather than prevented."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    claimed = sum(core_share(chip) for chip in chips)
    if load + claimed <= cores:
        return None
    return (f"the host's load average is {load:.1f} on {cores} cores before the job's {len(chips)} ranks "
            f"(claiming {claimed:.2g} cores) start: emulated kernels may run late when the host cannot give "
            f"them their share (stage_report.json counts late kernel time)")


def host_work_warning(cores_used: float, cores: int) -> str | None:
    """After a run: a warning when the job's ranks used more host cores in steps (kernels and the
    framework's work around them, measured) than the trust rule grants, so that step times may
    reflect the host rather than the emulated chips. None when they stayed inside the rule."""
    allowed = CORE_SHARE_LIMIT * cores
    if cores_used <= allowed:
        return None
    return (f"the ranks used {cores_used:.2f} host cores in steps, more than the trust rule's {CORE_SHARE_LIMIT:g} x "
            f"{cores} = {allowed:.2g}: step times may depend on the host, not only on the emulated chips "
            f"(docs/emulation.md, \"What the rule leaves out\")")


def rank_chips(strategy: Strategy, cluster: ClusterSpec, ranks: range | None = None) -> list[ChipType]:
    """The chip type of each rank in `ranks` (default: all) under the strategy's rank layout."""
    return [cluster.chip(name) for rank, name in enumerate(strategy.rank_chips()) if ranks is None or rank in ranks]


def emulated_stage_devices(strategy: Strategy, cluster: ClusterSpec, source: str) -> Strategy:
    """The strategy with every stage of an emulated chip type (or of a chip type of another DIPU vendor,
    ChipType.on_dipu) on the dipu device; a stage that names another device for such a chip is refused."""
    import dataclasses

    stages = []
    for index, stage in enumerate(strategy.stages):
        emulated = [cluster.chip(name) for name in dict.fromkeys(stage.chips or [stage.chip])]
        if any(chip.on_dipu for chip in emulated):
            if len(emulated) > 1 and not all(chip.on_dipu for chip in emulated):
                raise UserError(f"{source}: field 'stages[{index}].chips': a group mixes emulated and real chip "
                                f"types (cluster {cluster.source}); its replicas must share one device type")
            if stage.device not in (None, EMULATED_DEVICE):
                raise UserError(f"{source}: field 'stages[{index}].device': chip '{emulated[0].name}' is emulated on "
                                f"the {EMULATED_DEVICE} device (cluster {cluster.source}), not on '{stage.device}'")
            stage = dataclasses.replace(stage, device=EMULATED_DEVICE)
        stages.append(stage)
    return dataclasses.replace(strategy, stages=stages)
