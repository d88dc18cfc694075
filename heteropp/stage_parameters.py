"""A stage's parameters under the full model's names and whole (TP shards gathered): what a system
that knows the model but not the pipeline (Di-PS's parameter server) sends and receives.

A stage names its parameters after its own modules: local layer indices, `inner` under a TP block,
`layer` under recompute, `proj` inside the vocabulary-parallel head. `full_name` maps them back to
the `Transformer`'s names; `split_dim` says along which dimension TP cut each one (None: replicated).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_ROW_PARALLEL = ("o_proj", "down_proj")   # cut along their input features (dimension 1)
_WRAPPERS = ("inner", "layer", "proj")    # module names a stage adds around the model's own


def full_name(stage_name: str, layers: range) -> str:
    """The full-model name of parameter `stage_name` of a stage that holds decoder layers `layers`."""
    parts = stage_name.split(".")
    if parts[0] == "layers":
        parts[1] = str(layers.start + int(parts[1]))
        parts = parts[:2] + [part for part in parts[2:] if part not in _WRAPPERS]
    else:
        parts = [part for part in parts if part not in _WRAPPERS]
    return ".".join(parts)


def split_dim(name: str) -> int | None:
    """The dimension TP splits full-model parameter `name` along; None for the replicated norm weights."""
    if name.endswith("norm.weight"):
        return None
    return 1 if any(f".{proj}." in name for proj in _ROW_PARALLEL) else 0


def gather_full(named: list[tuple[str, torch.Tensor]], layers: range, tp_group,
                tp_size: int) -> dict[str, torch.Tensor]:
    """The stage's parameters, whole, by full-model name (every rank of the TP group takes part)."""
    whole = {}
    for name, param in named:
        full = full_name(name, layers)
        dim = split_dim(full)
        if tp_size == 1 or dim is None:
            whole[full] = param.detach()
            continue
        parts = [torch.empty_like(param) for _ in range(tp_size)]
        dist.all_gather(parts, param.detach().contiguous(), group=tp_group)
        whole[full] = torch.cat(parts, dim=dim)
    return whole


@torch.no_grad()
def load_full(named: list[tuple[str, torch.Tensor]], layers: range, tp_index: int, tp_size: int,
              whole: dict[str, torch.Tensor]) -> None:
    """Copy this TP rank's slice of each whole full-model tensor into the stage's parameters."""
    for name, param in named:
        full = full_name(name, layers)
        dim = split_dim(full)
        value = whole[full] if tp_size == 1 or dim is None else whole[full].chunk(tp_size, dim=dim)[tp_index]
        param.copy_(value)
