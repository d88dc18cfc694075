"""The strategy file: what HeteroAuto writes and HeteroPP reads.

    dp: 4                      # data-parallel replicas of the whole pipeline
    micro_batches: 32          # per replica per iteration (b); global batch = dp * b * micro_batch_size
    micro_batch_size: 1        # sequences per micro-batch
    seq_len: 4096              # optional; tokens per sequence
    schedule: 1f1b             # or 1f1b-split-backward (zero-bubble style, alpha = 0)
    model: h2-100b             # preset name, or a mapping of ModelConfig fields (with optional `preset`)
    stages:                    # pipeline order
      - {chip: A, tp: 4, layers: 12, recompute: false}
      - ...

Rank mapping (HeteroPP): stage 0 gets global ranks [0, tp0*dp), stage 1 the next tp1*dp ranks, and so
on; each stage's chips are tp * dp of its chip type. The layers of all stages sum to the model's.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

import yaml

from h2.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.errors import UserError
from h2.model.config import PRESETS, ModelConfig, resolve_model



@dataclass(frozen=True)
class StageSpec:
    chip: str
    tp: int
    layers: int
    recompute: bool = False


@dataclass
class Strategy:
    dp: int
    micro_batches: int
    micro_batch_size: int
    stages: list[StageSpec]
    model: str | dict = "tiny"
    schedule: Literal["1f1b", "1f1b-split-backward"] = "1f1b"
    seq_len: int | None = None

    def model_config(self, source: str = "strategy") -> ModelConfig:
        if isinstance(self.model, str):
            return resolve_model(self.model)
        data = dict(self.model)
        base = data.pop("preset", None)
        if base is not None:
            if base not in PRESETS:
                raise UserError(f"{source}: field 'model.preset': unknown preset '{base}'")
            data = {**PRESETS[base].to_dict(), **data}
        return dataclass_from_mapping(ModelConfig, data, f"{source}: field 'model'")

    def chips_per_type(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for stage in self.stages:
            used[stage.chip] = used.get(stage.chip, 0) + stage.tp * self.dp
        return used

    def stage_ranks(self) -> list[range]:
        """Global ranks of each stage: consecutive blocks of tp * dp, in pipeline order."""
        ranks, start = [], 0
        for stage in self.stages:
            ranks.append(range(start, start + stage.tp * self.dp))
            start += stage.tp * self.dp
        return ranks

    def validate(self, source: str = "strategy") -> None:
        for name in ("dp", "micro_batches", "micro_batch_size"):
            if getattr(self, name) <= 0:
                raise UserError(f"{source}: field '{name}' must be positive, got {getattr(self, name)}")
        if self.seq_len is not None and self.seq_len <= 0:
            raise UserError(f"{source}: field 'seq_len' must be positive, got {self.seq_len}")
        if not self.stages:
            raise UserError(f"{source}: field 'stages' must list at least one stage")
        for index, stage in enumerate(self.stages):
            if stage.tp <= 0 or stage.tp & (stage.tp - 1):
                raise UserError(f"{source}: field 'stages[{index}].tp' must be a power of two, got {stage.tp}")
            if stage.layers <= 0:
                raise UserError(f"{source}: field 'stages[{index}].layers' must be positive, got {stage.layers}")
        model = self.model_config(source)
        total = sum(stage.layers for stage in self.stages)
        if total != model.num_layers:
            raise UserError(f"{source}: field 'stages': layers sum to {total}, model '{model.name}' has {model.num_layers}")

    def to_dict(self) -> dict:
        data = {"dp": self.dp, "micro_batches": self.micro_batches, "micro_batch_size": self.micro_batch_size}
        if self.seq_len is not None:
            data["seq_len"] = self.seq_len
        data["schedule"] = self.schedule
        data["model"] = self.model
        data["stages"] = [dataclasses.asdict(stage) for stage in self.stages]
        return data

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle, sort_keys=False, default_flow_style=None)


def strategy_from_mapping(data: dict, source: str) -> Strategy:
    data = dict(data)
    model = data.pop("model", "tiny")
    if not isinstance(model, (str, dict)):
        raise UserError(f"{source}: field 'model': expected a preset name, a path or a mapping, got {model!r}")
    strategy = dataclass_from_mapping(Strategy, data, source)
    strategy.model = model
    strategy.validate(source)
    return strategy


def load_strategy(path: str | os.PathLike) -> Strategy:
    path = os.fspath(path)
    return strategy_from_mapping(load_yaml_mapping(path), path)
