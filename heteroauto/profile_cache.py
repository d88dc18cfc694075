"""The profile cache: where each chip type's profile file lives, which cached files are still valid
(measured for the same chip entry, model and micro-batch shape), and which chip types must be measured.

Measuring is the runtime's (h2.launch.profiling_job runs it); this module decides and reads/writes files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.emulation import UNTRUSTED_FRACTION, describe_chip
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from heteroauto.profiles import Profile, load_profile, profile_fingerprint, save_profile

PROFILES_ROOT = "profiles"


def cluster_folder(cluster: ClusterSpec) -> str:
    """`heteroauto profile`'s default folder: profiles/<cluster name>/."""
    return os.path.join(PROFILES_ROOT, cluster.name)


def model_folder(cluster: ClusterSpec, model: ModelConfig) -> str:
    """`h2 run`'s default folder: profiles/<cluster name>/<model name>/ (one file per chip type)."""
    return os.path.join(PROFILES_ROOT, cluster.name, model.name)


def check_output_file(path: str, flag: str) -> None:
    """Refuse, before any work, an output file whose folder cannot be created or written."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise UserError(f"{flag} {path}: cannot create folder '{folder}' ({error.strerror or error})") from None
    if not os.access(folder, os.W_OK):
        raise UserError(f"{flag} {path}: folder '{folder}' is not writable")


@dataclass(frozen=True)
class ProfileTarget:
    """One chip type to profile and the file its profile goes to."""
    chip: ChipType
    path: str


def profile_targets(cluster: ClusterSpec, folder: str, chip: str | None = None,
                    out_file: str | None = None) -> list[ProfileTarget]:
    """The chip types to profile (`chip`, or every one of the cluster) and their files: `out_file` for
    the one chip, else FOLDER/<chip>.yaml; each file's folder checked writable before any work."""
    if out_file is not None and chip is None:
        raise UserError("--out names one profile file: give --chip too (or --out-dir for every chip type)")
    chips = [cluster.chip(chip)] if chip is not None else list(cluster.chips)
    targets = [
        ProfileTarget(c, out_file if out_file is not None else os.path.join(folder, f"{c.name}.yaml")) for c in chips
    ]
    for target in targets:
        check_output_file(target.path, "--out" if out_file is not None else "--out-dir")
    return targets


def cached_profile(target: ProfileTarget, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                   trusted_only: bool = False) -> Profile | None:
    """The profile in the target's file if it was measured for exactly this chip entry, model and shape
    (and, with `trusted_only`, trusted: a profile written with `trusted: false` is measured again)."""
    if not os.path.exists(target.path):
        return None
    try:
        profile = load_profile(target.path)
    except UserError:
        return None
    up_to_date = profile.fingerprint == profile_fingerprint(cluster, target.chip, model, training)
    return profile if up_to_date and (profile.trusted or not trusted_only) else None


def cached_profiles(targets: list[ProfileTarget], cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                    trusted_only: bool = False) -> dict[str, Profile]:
    """The up-to-date cached profile of each target that has one, by chip name (`trusted_only`: cached_profile)."""
    found = {target.chip.name: cached_profile(target, cluster, model, training, trusted_only) for target in targets}
    return {name: profile for name, profile in found.items() if profile is not None}


def to_measure(targets: list[ProfileTarget], cached: dict[str, Profile]) -> list[ProfileTarget]:
    """The targets without an up-to-date cached profile."""
    return [target for target in targets if target.chip.name not in cached]


def save_profiles(targets: list[ProfileTarget], profiles: dict[str, Profile], skip: set[str] = frozenset()) -> None:
    """Write each target's profile to its file, except the chip types in `skip` (read from the cache)."""
    for target in targets:
        if target.chip.name not in skip:
            os.makedirs(os.path.dirname(os.path.abspath(target.path)), exist_ok=True)
            save_profile(profiles[target.chip.name], target.path)


def profile_report(profile: Profile, target: ProfileTarget, how: str) -> str:
    """A profile as `heteroauto profile` and `h2 profile` print it: the chip, where the file is and
    whether it was `how` = cached, measured or synthesised; a row per TP size, beside the formula's
    prediction from tp 1 where the profile has one."""
    where = describe_chip(target.chip) + (f", device {profile.device}" if profile.device else "")
    state = f"up to date in {target.path}" if how == "cached" else f"wrote {target.path}"
    lines = [f"profile of chip {where}: {profile.source}, {state}"]
    if not profile.trusted:
        lines.append(f"  UNTRUSTED: {profile.late_fraction:.1%} of its emulated kernel time ran late, more than "
                     f"{UNTRUSTED_FRACTION:.0%}: it follows the host's load, not the chip")
    lines += [f"  {line}" for line in (profile.assumptions[-1:] if profile.source == "measured" else ())]
    formula = {entry.tp: entry for entry in profile.formula_layers}
    header = f"{'tp':>3} {'fwd ms':>9} {'bwd ms':>9} {'recomp ms':>9} {'act MB':>8} {'act MB rc':>9}"
    lines.append(header +
                 (f" | {'formula from tp 1: fwd ms':>25} {'bwd ms':>9} {'measured/formula':>16}" if formula else ""))
    for entry in profile.layers:
        line = (f"{entry.tp:>3} {entry.forward_s * 1e3:>9.2f} {entry.backward_s * 1e3:>9.2f} "
                f"{entry.recompute_s * 1e3:>9.2f} {entry.activation_bytes / 1e6:>8.3f} "
                f"{entry.recompute_activation_bytes / 1e6:>9.3f}")
        if entry.tp in formula:
            derived = formula[entry.tp]
            ratio = entry.compute_s(False) / derived.compute_s(False)
            line += f" | {derived.forward_s * 1e3:>25.2f} {derived.backward_s * 1e3:>9.2f} {ratio:>16.2f}"
        lines.append(line)
    return "\n".join(lines)
