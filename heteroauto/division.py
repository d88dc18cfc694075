"""Memory-aware stage division (JEEVES section 3.2): how many layers each pipeline stage gets when
stages hold different numbers of micro-batches in flight.

A stage's activation memory is its layers times the micro-batches it holds (in "layer units": one
layer's activations of one micro-batch); its time per micro-batch is its layers times its per-layer
time. Both solvers are exact dynamic programs over (stage, layers so far), O(stages x layers^2):

- `fastest_division_within`: the fastest slowest stage whose every stage fits a memory limit;
- `division_for_wish`: with at most `max_layers` on a stage, the division that lets every stage hold
  the largest share of the micro-batches it would hold with no limit (its wish).

Pure Python; must not import the runtime or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from h2.core.errors import UserError


@dataclass(frozen=True)
class Division:
    layers: tuple[int, ...]
    peak_activation_units: float
    slowest_stage_s: float


def _check(num_layers: int, in_flight: Sequence[int], layer_s: Sequence[float]) -> None:
    if len(in_flight) < 1 or num_layers < len(in_flight):
        raise UserError(f"division: {num_layers} layers cannot fill {len(in_flight)} stages (one layer each at least)")
    if len(layer_s) != len(in_flight):
        raise UserError(f"division: need one per-layer time per stage ({len(in_flight)}), got {len(layer_s)}")
    for stage, held in enumerate(in_flight):
        if held < 1:
            raise UserError(f"division: stage {stage} holds {held} micro-batches; every stage holds at least one")


def _min_max(num_layers: int, stages: int, cost: Callable[[int, int], float]) -> tuple[float, tuple[int, ...]]:
    """Minimise max_s cost(s, layers_s) over layers_s >= 1 summing to num_layers (exact DP)."""
    best = [[math.inf] * (num_layers + 1) for _ in range(stages + 1)]
    choice = [[0] * (num_layers + 1) for _ in range(stages + 1)]
    best[0][0] = -math.inf
    for s in range(1, stages + 1):
        for used in range(s, num_layers - (stages - s) + 1):
            for layers in range(1, used - (s - 1) + 1):
                value = max(best[s - 1][used - layers], cost(s - 1, layers))
                if value < best[s][used]:
                    best[s][used], choice[s][used] = value, layers
    layers, used = [], num_layers
    for s in range(stages, 0, -1):
        layers.append(choice[s][used])
        used -= choice[s][used]
    return best[stages][num_layers], tuple(reversed(layers))


def _division(layers: tuple[int, ...], in_flight: Sequence[int], layer_s: Sequence[float]) -> Division:
    return Division(layers=layers, peak_activation_units=max(l * k for l, k in zip(layers, in_flight)),
                    slowest_stage_s=max(l * t for l, t in zip(layers, layer_s)))


def fastest_division_within(num_layers: int, in_flight: Sequence[int], limit_units: float,
                            layer_s: Sequence[float] | None = None) -> Division | None:
    """The division whose slowest stage is fastest with layers_s x in_flight_s <= limit_units on every
    stage; None when no division fits."""
    layer_s = list(layer_s) if layer_s is not None else [1.0] * len(in_flight)
    _check(num_layers, in_flight, layer_s)
    value, layers = _min_max(num_layers, len(in_flight), lambda s, l: l * layer_s[s]
                             if l * in_flight[s] <= limit_units else math.inf)
    return None if math.isinf(value) else _division(layers, in_flight, layer_s)


def division_for_wish(num_layers: int, wish: Sequence[int], limit_units: float,
                      max_layers: int) -> tuple[int, ...] | None:
    """Layers per stage (none above max_layers) maximising min_s min(1, k_s / wish_s), where k_s =
    floor(limit_units / layers_s) micro-batches fit stage s; None when max_layers cannot hold the model."""
    _check(num_layers, wish, [1.0] * len(wish))

    def shortfall(stage: int, layers: int) -> float:
        if layers > max_layers:
            return math.inf
        return -min(1.0, math.floor(limit_units / layers) / wish[stage])

    value, layers = _min_max(num_layers, len(wish), shortfall)
    return None if math.isinf(value) else layers
