"""Profiling a cluster's chip types: the chip types without an up-to-date cached profile are measured by
running the runtime's stage code on TP ranks of each chip (heteropp.profiling; an emulated chip on its
emulated dipu device), the rest read from the cache (heteroauto.profile_cache), or all synthesised from
the spec sheet. `heteroauto profile`, `h2 profile` and `h2 run` call `profile_chips`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.devices import resolve_device
from h2.core.emulation import UNTRUSTED_FRACTION, check_core_share, host_cores, measurement_trust
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from heteroauto.profile_cache import ProfileTarget, cached_profiles, save_profiles, to_measure
from heteroauto.profiles import Profile, measured_profile, synthesise_profile


@dataclass(frozen=True)
class MeasureOptions:
    """How a TP size is measured: on `device` (chips without emulation), the median of `repeats` timed
    rounds; taken again, up to `attempts` times, while more than `max_late` of its emulated kernel time
    ran late (the host's load, not the chip), the least late kept."""
    device: str = "cpu"
    repeats: int = 5
    attempts: int = 2
    max_late: float = UNTRUSTED_FRACTION
    refuse_invalid: bool = False  # stop at the first INVALID measurement (UntrustedProfile)

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise UserError("--repeats: must be at least 1")
        if self.attempts < 1:
            raise UserError("--attempts: must be at least 1")
        if not 0 <= self.max_late:
            raise UserError(f"--max-late: must be a fraction >= 0, got {self.max_late}")


class UntrustedProfile(UserError):
    """A measured profile the host's load decided (more than UNTRUSTED_FRACTION of its emulated kernel time
    late), refused unless forced: one line, exit 2 like every refusal."""


def refuse_if_invalid(chip: str, tp: int, late_fraction: float) -> None:
    """One line when the measurement of `chip` at `tp` kept is INVALID: refused as soon as it is taken, so a
    busy host costs one measurement, and no profile is written."""
    if not measurement_trust(late_fraction, 1.0).trusted:
        raise UntrustedProfile(
            f"INVALID profile of chip '{chip}' not written: {late_fraction:.1%} of its emulated kernel time at tp "
            f"{tp} ran late (the host's load, not the chip; limit {UNTRUSTED_FRACTION:.0%}); measure on a quieter "
            f"host, or --force to write it marked untrusted")


@dataclass(frozen=True)
class ProfiledChips:
    """Each target's profile by chip name, and how it was had: "cached", "measured" or "synthesised"."""
    profiles: dict[str, Profile]
    how: dict[str, str]


def measure(cluster: ClusterSpec, targets: list[ProfileTarget], model: ModelConfig, training: TrainingSpec,
            options: MeasureOptions) -> dict[str, list[dict]]:
    """Measure every (chip, TP size) on TP ranks, with one progress bar over them all; the measurements
    (heteropp.profiling.TPMeasurement as dicts) by chip name."""
    from h2.train.progress import ProgressBar
    from heteropp.profiling import measure_tp  # imports torch

    dtype = "bfloat16" if training.activation_bytes_per_element == 2 else "float32"
    jobs = [(target, tp) for target in targets for tp in target.chip.tp_sizes()]
    bar = ProgressBar(len(jobs))
    bar.update(0, chip=jobs[0][0].chip.name if jobs else "-")
    measured: dict[str, list[dict]] = {}
    for done, (target, tp) in enumerate(jobs, start=1):
        chip = target.chip
        directory = os.path.join(os.path.dirname(os.path.abspath(target.path)), "emulated-chips")
        attempts = []
        while len(attempts) < options.attempts and (not attempts or attempts[-1].late_fraction > options.max_late):
            attempts.append(
                measure_tp(chip, model, tp, micro_batch_size=training.micro_batch_size, seq_len=training.seq_len,
                           dtype=dtype, device=options.device, repeats=options.repeats, directory=directory,
                           cluster=cluster))
        measurement = min(attempts, key=lambda attempt: attempt.late_fraction)
        if options.refuse_invalid:
            refuse_if_invalid(chip.name, tp, measurement.late_fraction)
        measured.setdefault(chip.name, []).append(dataclasses.asdict(measurement))
        bar.update(done, chip=f"{chip.name} tp {tp}")
    return measured


def _check_host_can_measure(cluster: ClusterSpec, targets: list[ProfileTarget], options: MeasureOptions) -> None:
    """Refuse, before any rank starts, more ranks than the host's cores can run as their chips."""
    for target in targets:  # one measurement runs tp_max ranks of the chip at once
        chip = target.chip
        check_core_share([chip] * chip.tp_max, host_cores(), cluster.source,
                         f"profiling ranks of chip '{chip.name}' at tp {chip.tp_max}")


def _measured(cluster: ClusterSpec, targets: list[ProfileTarget], model: ModelConfig, training: TrainingSpec,
              options: MeasureOptions) -> dict[str, Profile]:
    if not targets:
        return {}
    if any(target.chip.emulation is None for target in targets):
        resolve_device(options.device)  # the measuring ranks would each fail on a device this host lacks
    return {
        name: measured_profile(cluster, cluster.chip(name), model, training, measurements, device=options.device,
                               repeats=options.repeats)
        for name, measurements in measure(cluster, targets, model, training, options).items()
    }


def profile_chips(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, targets: list[ProfileTarget],
                  options: MeasureOptions = MeasureOptions(), *, force: bool = False, synthesise: bool = False,
                  refuse_untrusted: bool = True) -> ProfiledChips:
    """The profile of every target, written to its file unless read from it: synthesised, or reused from
    the cache where up to date (unless `force`) and measured for the rest. With `refuse_untrusted` (heteroauto
    profile) a measurement that is INVALID (h2.core.emulation.measurement_trust) is refused at once, nothing
    written, unless `force` (then the profile is written with `trusted: false`), and a cached profile marked
    so is measured again; without it (h2 run, h2 profile) such a profile is written and reused, marked."""
    if synthesise:
        profiles = {target.chip.name: synthesise_profile(target.chip, model, training) for target in targets}
        how = dict.fromkeys(profiles, "synthesised")
    else:
        _check_host_can_measure(cluster, targets, options)
        cached = {} if force else cached_profiles(targets, cluster, model, training, trusted_only=refuse_untrusted)
        options = dataclasses.replace(options, refuse_invalid=refuse_untrusted and not force)
        measured = _measured(cluster, to_measure(targets, cached), model, training, options)
        profiles = {**cached, **measured}
        how = {**dict.fromkeys(cached, "cached"), **dict.fromkeys(measured, "measured")}
    save_profiles(targets, profiles, skip={name for name, state in how.items() if state == "cached"})
    return ProfiledChips(profiles, how)
