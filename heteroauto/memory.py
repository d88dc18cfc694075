"""Memory of one pipeline stage on one chip, by its position in the pipeline.

A stage holding `layers` decoder layers at position p of P, with dp data-parallel replicas and tp-way
tensor parallelism, keeps per chip:
- parameters (weight_bytes each), gradients (gradient_bytes each) and optimizer states
  (optimizer_bytes each, divided by dp under ZeRO-1) of its shard of the layers;
- the activations of min(P - p, b) micro-batches in flight under 1F1B (earlier stages hold more:
  Observation 4); with recompute only each layer's input, plus one layer's full activations while
  it is recomputed; and the workspace of one layer's backward (where the profile measured it);
- on the first stage the (vocab-parallel) embedding, on the last the final norm, the head and one
  micro-batch of fp32 logits.
Every stage of a group is checked with the group's largest layer count (ceil(l / pp)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from h2.core.cluster import TrainingSpec
from h2.core.model_config import ModelConfig
from heteroauto import _dp
from heteroauto.profiles import LayerProfile


def in_flight_micro_batches(position: int, num_stages: int, micro_batches: int) -> int:
    return min(num_stages - position, micro_batches)


def state_bytes_per_param(training: TrainingSpec, dp: int) -> float:
    optimizer = training.optimizer_bytes / dp if training.zero1 else training.optimizer_bytes
    return training.weight_bytes + training.gradient_bytes + optimizer


def layer_shard_params(model: ModelConfig, tp: int) -> float:
    norms = 2 * model.hidden_size  # replicated across the TP group
    return (model.layer_params() - norms) / tp + norms


@dataclass(frozen=True)
class StageMemoryTerms:
    """memory(layers) = fixed + layers * per_layer, for layers >= 1."""
    fixed: float
    per_layer: float

    def bytes(self, layers: int) -> float:
        return self.fixed + layers * self.per_layer

    def max_layers(self, capacity: float, limit: int) -> int:
        """The most layers (at most `limit`) with bytes(layers) <= capacity, exactly as bytes() rounds."""
        if self.bytes(1) > capacity:
            return 0
        if self.per_layer <= 0 or self.bytes(limit) <= capacity:
            return limit
        layers = min(limit, int((capacity - self.fixed) // self.per_layer))
        while layers > 0 and self.bytes(layers) > capacity:
            layers -= 1
        while layers < limit and self.bytes(layers + 1) <= capacity:
            layers += 1
        return layers


def stage_memory_terms(model: ModelConfig, training: TrainingSpec, layer: LayerProfile, *, dp: int, recompute: bool,
                       position: int, num_stages: int, micro_batches: int) -> StageMemoryTerms:
    return stage_memory_terms_at(model, training, layer, dp=dp, recompute=recompute, in_flight=in_flight_micro_batches(
        position, num_stages, micro_batches), first=position == 0, last=position == num_stages - 1)


def stage_memory_terms_at(model: ModelConfig, training: TrainingSpec, layer: LayerProfile, *, dp: int, recompute: bool,
                          in_flight: int, first: bool, last: bool) -> StageMemoryTerms:
    """The same, by what the position implies: micro-batches in flight, first stage, last stage."""
    per_param = state_bytes_per_param(training, dp)
    kept = layer.recompute_activation_bytes if recompute else layer.activation_bytes
    per_layer = layer_shard_params(model, layer.tp) * per_param + in_flight * kept
    fixed = float(layer.activation_bytes) if recompute else 0.0
    fixed += layer.workspace_bytes  # one layer's backward at a time (measured profiles; 0 when synthesised)
    fixed += end_bytes(model, training, tp=layer.tp, dp=dp, first=first, last=last)
    return StageMemoryTerms(fixed=fixed, per_layer=per_layer)


def end_bytes(model: ModelConfig, training: TrainingSpec, *, tp: int, dp: int, first: bool, last: bool) -> float:
    """What the first stage (the embedding) and the last (final norm, head, one micro-batch of fp32 logits)
    hold beyond their layers."""
    per_param = state_bytes_per_param(training, dp)
    held = model.embedding_params() / tp * per_param if first else 0.0
    if last:
        held += (model.head_params() / tp + model.final_norm_params()) * per_param
        held += training.micro_batch_size * training.seq_len * model.vocab_size / tp * 4  # fp32 logits
    return held


def stage_memory_bytes(model: ModelConfig, training: TrainingSpec, layer: LayerProfile, *, dp: int, recompute: bool,
                       position: int, num_stages: int, micro_batches: int, layers: int) -> float:
    return stage_memory_terms(model, training, layer, dp=dp, recompute=recompute, position=position,
                              num_stages=num_stages, micro_batches=micro_batches).bytes(layers)


def stage_caps_table(model: ModelConfig, training: TrainingSpec, variants: list[tuple[LayerProfile, bool]], *, dp: int,
                     in_flight: np.ndarray, ends: list[tuple[bool, bool]], capacity: float, limit: int) -> np.ndarray:
    """StageMemoryTerms.max_layers (same rounding) of every (layer profile, recompute) variant, every
    (first, last) stage kind and every count of micro-batches in flight: shape (variants, ends, counts).
    The kinds differ only in the fixed bytes (embedding, head). The rounding in C++ (_dp.stage_caps: the
    planner asks this for every chip and dp); stage_caps_table_reference is the numpy one."""
    fixed, per_layer = _variant_terms(model, training, variants, dp=dp, in_flight=in_flight, ends=ends)
    return np.stack([_dp.stage_caps(f, p, float(capacity), float(limit)) for f, p in zip(fixed, per_layer)])


def _variant_terms(model: ModelConfig, training: TrainingSpec, variants: list[tuple[LayerProfile, bool]], *, dp: int,
                   in_flight: np.ndarray, ends: list[tuple[bool, bool]]) -> tuple[np.ndarray, np.ndarray]:
    """(fixed bytes per variant and kind (variants, kinds), bytes per layer per variant and count in flight
    (variants, counts))."""
    bases = [
        stage_memory_terms_at(model, training, layer, dp=dp, recompute=recompute, in_flight=0, first=False, last=False)
        for layer, recompute in variants
    ]
    ends_of = {
        tp: [end_bytes(model, training, tp=tp, dp=dp, first=first, last=last) for first, last in ends]
        for tp in {layer.tp for layer, _ in variants}
    }
    kept = np.array([
        layer.recompute_activation_bytes if recompute else layer.activation_bytes for layer, recompute in variants
    ])
    counts = np.asarray(in_flight, dtype=np.int64)
    per_layer = np.array([base.per_layer for base in bases])[:, None] + kept[:, None] * counts[None, :]
    fixed = np.array([[base.fixed + held for held in ends_of[layer.tp]] for base, (layer, _) in zip(bases, variants)])
    return fixed, per_layer


def stage_caps_table_reference(model: ModelConfig, training: TrainingSpec, variants: list[tuple[LayerProfile, bool]], *,
                               dp: int, in_flight: np.ndarray, ends: list[tuple[bool, bool]], capacity: float,
                               limit: int) -> np.ndarray:
    fixed, per_layer = _variant_terms(model, training, variants, dp=dp, in_flight=in_flight, ends=ends)
    fixed, per_layer = fixed[:, :, None], per_layer[:, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        layers = np.floor((capacity - fixed) / per_layer)
    layers = np.clip(np.nan_to_num(layers, nan=limit, posinf=limit, neginf=0), 0, limit)
    for _ in range(3):  # land exactly where fixed + layers * per_layer stops fitting
        layers = np.where((layers > 0) & (fixed + layers * per_layer > capacity), layers - 1, layers)
        layers = np.where((layers < limit) & (fixed + (layers + 1) * per_layer <= capacity), layers + 1, layers)
    return np.where(fixed + per_layer > capacity, 0.0, layers)
