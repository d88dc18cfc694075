"""The one place that maps a stage's parameters to the whole model's names and says how tensor
parallelism cut each one; checkpoints (through `PipelineEngine.parameter_pieces`), the engine's
optimizer and global norm, and Di-PS (`gather_full` / `load_full`) all read a stage through it.

A stage names its parameters after its own modules: local layer indices, and one more level under
each module wrapped around the model's own (TP's `ParallelBlock` and `ColumnParallelHead`,
recompute's `RecomputedLayer`); such a wrapper names the attribute that holds what it wraps in its
class attribute `wraps`. A TP module holding a shard of a model weight records in `tp_split_dim` the
dimension it was cut along (None: it holds the weight whole); nothing here reads a name's suffix.
Shards are `torch.chunk` pieces: `shard_of` cuts one, `whole_of` puts them back together.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn


class StageParameter(NamedTuple):
    name: str  # its name in the whole `Transformer`
    param: nn.Parameter  # this rank's tensor
    split_dim: int | None  # the dimension TP cut it along; None where this rank holds it whole


def shard_of(whole: torch.Tensor, dim: int | None, index: int, parts: int) -> torch.Tensor:
    """Piece `index` of `parts` of `whole` along `dim`, as tensor parallelism cuts a weight (all of
    it for one part or dim None)."""
    return whole if parts == 1 or dim is None else whole.chunk(parts, dim=dim)[index]


def whole_of(shards: list[torch.Tensor], dim: int | None) -> torch.Tensor:
    """The tensor `shards` (every piece, in order) were cut from along `dim` (dim None: alike, the first)."""
    return shards[0] if len(shards) == 1 or dim is None else torch.cat(shards, dim=dim)


def stage_parameters(stage: nn.Module, layers: range) -> list[StageParameter]:
    """Every parameter of `stage` (holding decoder layers `layers`), in `named_parameters` order:
    'layers.0.attn.inner.q_proj.weight' of a stage whose layers start at 3 is 'layers.3.attn.q_proj.weight'."""
    model_paths = _model_paths(stage, layers)
    parameters = []
    for stage_name, param in stage.named_parameters():
        owner, _, attribute = stage_name.rpartition(".")
        split_dim = getattr(stage.get_submodule(owner), "tp_split_dim", None)
        parameters.append(StageParameter(_join(model_paths[owner], attribute), param, split_dim))
    return parameters


def _join(path: str, attribute: str) -> str:
    return f"{path}.{attribute}" if path else attribute


def _model_paths(stage: nn.Module, layers: range) -> dict[str, str]:
    """The path in the whole model of every module of the stage, by its path in the stage."""
    paths = {"": ""}
    for path, module in stage.named_modules():  # a module before its children
        for attribute, child in module.named_children():
            if attribute == getattr(module, "wraps", None):
                model_path = paths[path]
            elif path == "layers":
                model_path = f"layers.{layers.start + int(attribute)}"
            else:
                model_path = _join(paths[path], attribute)
            paths[_join(path, attribute)] = model_path
    return paths


def gather_full(parameters: list[StageParameter], tp_group, tp_size: int) -> dict[str, torch.Tensor]:
    """The stage's parameters, whole, by full-model name (every rank of the TP group takes part)."""
    whole = {}
    for name, param, dim in parameters:
        if dim is None:
            whole[name] = param.detach()
            continue
        shards = [torch.empty_like(param) for _ in range(tp_size)]
        dist.all_gather(shards, param.detach().contiguous(), group=tp_group)
        whole[name] = whole_of(shards, dim)
    return whole


@torch.no_grad()
def load_full(parameters: list[StageParameter], tp_index: int, tp_size: int, whole: dict[str, torch.Tensor]) -> None:
    """Copy this TP rank's slice of each whole full-model tensor into the stage's parameters."""
    for name, param, dim in parameters:
        param.copy_(shard_of(whole[name], dim, tp_index, tp_size))
