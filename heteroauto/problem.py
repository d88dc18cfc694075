"""The planning problem: a loaded cluster, the model it trains, the training spec with the command's
overrides applied, and the chip profiles the planner prices it with.

Every command that plans (`heteroauto search/simulate/profile`, `h2 run/plan/profile`) builds its problem
here from a `ClusterSpec` it loaded once.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import PRESETS, ModelConfig, resolve_model
from heteroauto.profiles import Profile, profiles_for


@dataclass(frozen=True)
class TrainingOverrides:
    """What a command's flags change in the cluster file's `training` (None: keep the file's)."""
    seq_len: int | None = None
    global_batch_tokens: int | None = None
    global_batch_sequences: int | None = None
    micro_batch_size: int | None = None
    alpha: float | None = None
    no_zero1: bool = False


def model_for(cluster: ClusterSpec, name: str | None = None, default: ModelConfig | None = None) -> ModelConfig:
    """`name` (a preset, a YAML or a Hugging Face config.json), else `default`, else the cluster file's
    `model` (a model file named there is relative to the cluster file, as chip files are)."""
    if name is not None:
        return resolve_model(name)
    if default is not None:
        return default
    if cluster.model is None:
        raise UserError(f"{cluster.source}: no field 'model' and no --model given")
    relative = cluster.model not in PRESETS and not os.path.isabs(cluster.model)
    return resolve_model(os.path.join(os.path.dirname(cluster.source), cluster.model) if relative else cluster.model)


def training_with_overrides(cluster: ClusterSpec, model: ModelConfig,
                            overrides: TrainingOverrides = TrainingOverrides(),
                            default_seq_len: int | None = None) -> TrainingSpec:
    """The cluster file's `training` (else the model's sequence length) with `overrides` applied, checked."""
    base = dataclasses.asdict(cluster.training) if cluster.training else {"seq_len": model.max_seq_len}
    seq_len = overrides.seq_len if overrides.seq_len is not None else default_seq_len
    if seq_len is not None:
        base["seq_len"] = seq_len
    if overrides.global_batch_tokens is not None:
        base.update(global_batch_tokens=overrides.global_batch_tokens, global_batch_sequences=None)
    if overrides.global_batch_sequences is not None:
        base.update(global_batch_sequences=overrides.global_batch_sequences, global_batch_tokens=None)
    for name in ("micro_batch_size", "alpha"):
        if getattr(overrides, name) is not None:
            base[name] = getattr(overrides, name)
    if overrides.no_zero1:
        base["zero1"] = False
    if base.get("global_batch_tokens") is None and base.get("global_batch_sequences") is None:
        raise UserError(f"{cluster.source}: no global batch: add `training: {{global_batch_tokens: ...}}` or pass "
                        f"--gbs-tokens")
    training = TrainingSpec(**base)
    training.validate("training (cluster file and flags)")
    if training.seq_len > model.max_seq_len:
        raise UserError(f"training: seq_len {training.seq_len} exceeds model '{model.name}' max_seq_len "
                        f"{model.max_seq_len}")
    return training


def profile_paths(cluster: ClusterSpec, files: list[str] = (), folder: str | None = None) -> list[str]:
    """`files`, then the files of `folder` (a profile folder) that name one of the cluster's chip types."""
    paths = list(files)
    if folder is not None:
        if not os.path.isdir(folder):
            raise UserError(f"--profiles {folder}: no such folder (heteroauto profile --cluster {cluster.source} "
                            f"writes one)")
        named = {os.path.abspath(path) for path in paths}
        for chip in cluster.chips:
            path = os.path.join(folder, f"{chip.name}.yaml")
            if os.path.exists(path) and os.path.abspath(path) not in named:
                paths.append(path)
    return paths


@dataclass(frozen=True)
class PlanningProblem:
    """The cluster, model and training being planned, and the profile files measured for it."""
    cluster: ClusterSpec
    model: ModelConfig
    training: TrainingSpec
    profile_paths: tuple[str, ...] = ()

    def profiles(self, training: TrainingSpec | None = None) -> dict[str, Profile]:
        """The chip profiles (the files where given, synthesised for the rest) for `training` (default:
        the problem's)."""
        return profiles_for(self.cluster, self.model, training or self.training, list(self.profile_paths))

    def with_training(self, training: TrainingSpec) -> PlanningProblem:
        return dataclasses.replace(self, training=training)


def planning_problem(cluster: ClusterSpec, model: ModelConfig, overrides: TrainingOverrides = TrainingOverrides(),
                     profile_files: list[str] = (), profile_folder: str | None = None,
                     default_seq_len: int | None = None) -> PlanningProblem:
    """The problem of planning `model` on the loaded `cluster`, priced with the given profiles."""
    training = training_with_overrides(cluster, model, overrides, default_seq_len)
    return PlanningProblem(cluster, model, training, tuple(profile_paths(cluster, profile_files, profile_folder)))
