"""Layer sharding for one parallel configuration: how many layers each chip group gets.

Group g has pp_g stages; giving it l_g layers puts ceil(l_g / pp_g) on its bottleneck stage. With
per-layer compute t_g (one micro-batch) and per-layer update u_g, the cost model reads

    T(l) = max_g A_g * ceil(l_g / pp_g) + alpha * sum_g t_g * l_g,    A_g = (b - alpha) * t_g + u_g

subject to sum_g l_g = L, pp_g <= l_g (a stage holds at least one layer) and ceil(l_g / pp_g) <= K_g
(memory). The paper's heuristic first equalises compute (the smallest bound M on the max term that
still covers L layers), then refines under the memory caps. Here the refinement is exact: for a bound
M each group may hold up to u_g(M) = min(K_g, floor(M / A_g)) layers per stage, the cheapest-first
fill minimises the alpha term, and raising M is tried only while it can still pay off
(M + alpha * G_min < best), so the result is the minimum of T over all layer vectors.
"""

from __future__ import annotations

from typing import Sequence

_EPS = 1e-9
_SAFE = 1 - 1e-9  # bounds are shaded down so rounding never prunes an optimum they tie with


def _stage_caps(bound: float, weights: Sequence[float], caps: Sequence[int]) -> list[int]:
    """Per group, the most layers per stage whose weight stays within the bound (and memory)."""
    result = []
    for weight, cap in zip(weights, caps):
        quotient = bound / weight + _EPS if weight > 0 else float("inf")
        result.append(cap if quotient >= cap else int(quotient))
    return result


def _fill_cheapest_first(total: int, pps: Sequence[int], stage_caps: Sequence[int],
                         order: Sequence[int]) -> list[int] | None:
    layers = list(pps)
    remaining = total - sum(pps)
    for g in order:
        if remaining <= 0:
            break
        add = min(remaining, pps[g] * (stage_caps[g] - 1))
        layers[g] += add
        remaining -= add
    return layers if remaining == 0 else None


def objective(layers: Sequence[int], pps: Sequence[int], compute: Sequence[float], weights: Sequence[float],
              alpha: float) -> float:
    bottleneck = max(w * -(-l // p) for l, p, w in zip(layers, pps, weights))
    return bottleneck + alpha * sum(t * l for t, l in zip(compute, layers))


def _continuous_bottleneck(total: int, saturated: float, points: list[tuple[float, float, float]]) -> float:
    """Smallest M with saturated + sum_g min(held_g, rate_g * M) >= total; points are (held/rate, held, rate)."""
    points.sort()
    suffix_rates = [0.0] * (len(points) + 1)
    for i in range(len(points) - 1, -1, -1):  # summed from the end: no cancellation when subtracting
        suffix_rates[i] = suffix_rates[i + 1] + points[i][2]
    for i, (saturation, held, _) in enumerate(points):
        if saturated + suffix_rates[i] * saturation >= total:
            return (total - saturated) / suffix_rates[i]
        saturated += held
    return points[-1][0] if points else 0.0


def _equalise(total: int, pps: Sequence[int], weights: Sequence[float], caps: Sequence[int]) -> tuple[float, list[int]]:
    """The smallest bound on the max term whose per-stage caps cover all layers, and those caps."""
    free_layers = sum(p * k for p, k, w in zip(pps, caps, weights) if w <= 0)
    points = [(k * w, p * k, p / w) for p, k, w in zip(pps, caps, weights) if w > 0]
    bound = max([0.0] + [w for w in weights if w > 0] + [_continuous_bottleneck(total, free_layers, points)])
    while True:
        stage_caps = _stage_caps(bound, weights, caps)
        if sum(p * u for p, u in zip(pps, stage_caps)) >= total and min(stage_caps) >= 1:
            return bound, stage_caps
        bound = min(w * (u + 1) for w, u, k in zip(weights, stage_caps, caps) if u < k and w > 0)


def _feasible(total: int, pps: Sequence[int], caps: Sequence[int]) -> bool:
    return sum(pps) <= total and min(caps) >= 1 and sum(p * k for p, k in zip(pps, caps)) >= total


def lower_bound(total: int, pps: Sequence[int], compute: Sequence[float], update: Sequence[float], caps: Sequence[int],
                micro_batches: int, alpha: float) -> float:
    """A bound below shard_layers' optimum (inf when infeasible), without its refinement: the equalised
    max term plus alpha times the cheapest-first fill under memory alone."""
    if not _feasible(total, pps, caps):
        return float("inf")
    weights = [(micro_batches - alpha) * t + u for t, u in zip(compute, update)]
    bound, _ = _equalise(total, pps, weights, caps)
    if alpha == 0:
        return bound * _SAFE
    order = sorted(range(len(pps)), key=lambda g: compute[g])
    fill = _fill_cheapest_first(total, pps, caps, order)
    return (bound + alpha * sum(t * l for t, l in zip(compute, fill))) * _SAFE


def absorber_bound(total: int, absorbers: Sequence[tuple[int, float, int, float, float]], alpha: float) -> float:
    """Lower bound for groups described only as absorbers (least layers, layers per unit of max term,
    most layers, time per layer, weight): lets a DFS bound a subtree whose first groups are still open."""
    least = sum(a[0] for a in absorbers)
    most = sum(a[2] for a in absorbers)
    if least > total or most < total:
        return float("inf")
    bottleneck = max(a[4] for a in absorbers)
    saturated, points = 0.0, []
    for _, rate, capacity, _, _ in absorbers:
        if rate == float("inf"):
            saturated += capacity
        else:
            points.append((capacity / rate, capacity, rate))
    bottleneck = max(bottleneck, _continuous_bottleneck(total, saturated, points))
    if alpha == 0:
        return bottleneck * _SAFE
    remaining, cost = total - least, sum(a[0] * a[3] for a in absorbers)
    for a in sorted(absorbers, key=lambda a: a[3]):
        add = min(remaining, a[2] - a[0])
        cost += add * a[3]
        remaining -= add
        if remaining <= 0:
            break
    return (bottleneck + alpha * cost) * _SAFE


def shard_layers(total: int, pps: Sequence[int], compute: Sequence[float], update: Sequence[float], caps: Sequence[int],
                 micro_batches: int, alpha: float) -> tuple[float, list[int]] | None:
    """The layer vector minimising T, or None when the groups cannot hold `total` layers."""
    if not _feasible(total, pps, caps):
        return None
    weights = [(micro_batches - alpha) * t + u for t, u in zip(compute, update)]
    order = sorted(range(len(pps)), key=lambda g: compute[g])
    bound, stage_caps = _equalise(total, pps, weights, caps)  # equalise compute
    layers = _fill_cheapest_first(total, pps, stage_caps, order)
    best = (objective(layers, pps, compute, weights, alpha), layers)
    if alpha == 0:
        return best
    fill_floor = alpha * sum(t * l for t, l in zip(compute, _fill_cheapest_first(total, pps, caps, order)))
    while True:  # refine: a larger bound helps only if it lifts the cap of a saturated group
        # cheaper than the most expensive group that received layers beyond its minimum
        marginal = max((compute[g] for g in range(len(pps)) if layers[g] > pps[g]), default=None)
        if marginal is None:
            return best
        raisable = [
            w * (u + 1) for w, u, k, t in zip(weights, stage_caps, caps, compute) if u < k and w > 0 and t < marginal
        ]
        if not raisable:
            return best
        bound = min(raisable)
        if bound + fill_floor >= best[0] - _EPS * best[0]:
            return best
        stage_caps = _stage_caps(bound, weights, caps)
        layers = _fill_cheapest_first(total, pps, stage_caps, order)
        value = objective(layers, pps, compute, weights, alpha)
        if value < best[0]:
            best = (value, layers)
