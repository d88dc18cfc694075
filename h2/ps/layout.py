"""How the global model is cut into layers for the parameter servers, and how a layer travels.

A layer is one unit of the outer optimizer's state and of the data flow: `embed` (the embedding),
`layers.<i>` (one decoder layer) and `head` (the final norm and the output head). Each shard server
owns whole layers (assigned greedily by size, the largest first, to the least loaded shard), and one
thread of that shard serves each layer. On the wire a layer is its parameters in `named_parameters`
order, flattened and concatenated, float32 little-endian.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from h2.core.model_config import ModelConfig, resolve_model
from h2.model.transformer import Transformer

WIRE_DTYPE = torch.float32


@dataclass(frozen=True)
class Layer:
    name: str
    params: tuple[tuple[str, tuple[int, ...]], ...]  # (parameter name in the full model, shape)

    @property
    def numel(self) -> int:
        total = 0
        for _, shape in self.params:
            count = 1
            for size in shape:
                count *= size
            total += count
        return total

    @property
    def nbytes(self) -> int:
        return self.numel * WIRE_DTYPE.itemsize


def layer_of(parameter: str) -> str:
    """The layer a full-model parameter name belongs to."""
    if parameter.startswith("layers."):
        return ".".join(parameter.split(".")[:2])
    if parameter.startswith("embed."):
        return "embed"
    return "head"


def model_layers(config: ModelConfig) -> list[Layer]:
    """The model's layers in forward order (shapes only: the model is built on the meta device)."""
    with torch.device("meta"):
        model = Transformer(config)
    grouped: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for name, param in model.named_parameters():
        grouped.setdefault(layer_of(name), []).append((name, tuple(param.shape)))
    order = ["embed", *(f"layers.{i}" for i in range(config.num_layers)), "head"]
    return [Layer(name, tuple(grouped[name])) for name in order if name in grouped]


def assign_layers(layers: list[Layer], shards: int) -> list[list[str]]:
    """Layer names per shard: the largest layer first, each to the least loaded shard (ties: lower index)."""
    loads = [0] * shards
    owned: list[list[str]] = [[] for _ in range(shards)]
    for layer in sorted(layers, key=lambda layer: (-layer.nbytes, layers.index(layer))):
        shard = min(range(shards), key=lambda i: (loads[i], i))
        loads[shard] += layer.nbytes
        owned[shard].append(layer.name)
    order = [layer.name for layer in layers]
    return [sorted(names, key=order.index) for names in owned]


def flatten(layer: Layer, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The layer's parameters (by full-model name) as one contiguous float32 vector on the CPU."""
    return torch.cat([tensors[name].detach().to("cpu", WIRE_DTYPE).reshape(-1) for name, _ in layer.params])


def unflatten(layer: Layer, vector: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of `vector` shaped as the layer's parameters."""
    out, offset = {}, 0
    for name, shape in layer.params:
        count = 1
        for size in shape:
            count *= size
        out[name] = vector[offset:offset + count].view(shape)
        offset += count
    return out


def initial_model(model_name: str, seed: int) -> dict[str, torch.Tensor]:
    """Version 0 of the global model: the run's model built from its seed (the same tensors wherever built)."""
    torch.manual_seed(seed)
    return {name: param.detach() for name, param in Transformer(resolve_model(model_name)).named_parameters()}
