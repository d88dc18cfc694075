"""The exhaustive oracle: every point of the search space, no heuristics, no bounds.

For every dp dividing the global batch, every tp per group (with count = pp * tp * dp), every
recompute setting per group and every split of the layers over groups (each stage at least one),
it builds the explicit stage list, checks every stage's memory at its position (with its group's
largest layer count) and scores it with the cost model. Only for small clusters and models.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Iterator

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from heteropp.auto.cost import iteration_time_s
from heteropp.auto.memory import stage_memory_bytes
from heteropp.auto.profiles import Profile
from heteropp.auto.search import Candidate, Group, SearchResult, divisors, split_groups, type_groups
from h2.core.cluster import ClusterSpec, TrainingSpec

DEFAULT_LIMIT = 2_000_000


def compositions(total: int, minimums: list[int]) -> Iterator[tuple[int, ...]]:
    """Every vector l with l_g >= minimums[g] and sum l = total."""
    if not minimums:
        if total == 0:
            yield ()
        return
    head, rest = minimums[0], minimums[1:]
    for first in range(head, total - sum(rest) + 1):
        for tail in compositions(total - first, rest):
            yield (first,) + tail


def space_size(groups: list[Group], total_layers: int, dp_values: list[int]) -> int:
    per_dp = math.prod(2 * len(g.chip.tp_sizes()) for g in groups)
    return len(dp_values) * per_dp * math.comb(total_layers + len(groups) - 1, len(groups) - 1)


def oracle_search(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile], *,
                  group_size: int | None = None, dp: int | None = None, monotone_tp: bool = False,
                  limit: int = DEFAULT_LIMIT) -> SearchResult:
    """The best point of the space; `group_size` splits chip types into groups, `dp` fixes the
    data-parallel size and `monotone_tp` keeps tp from growing along a type's groups (together: the
    space of the search's second stage)."""
    started, started_cpu = time.perf_counter(), time.process_time()
    groups = split_groups(cluster, group_size) if group_size else type_groups(cluster)
    total_layers = model.num_layers
    dp_values = [dp] if dp is not None else divisors(training.micro_batch_units)
    size = space_size(groups, total_layers, dp_values)
    if size > limit:
        raise UserError(f"--exhaustive: the space has about {size:.3g} points (limit {limit:.3g}); "
                        "use it on small clusters and models")
    best, evaluated = None, 0
    for dp in dp_values:  # noqa: B020 (the loop variable replaces the argument on purpose)
        micro_batches = training.micro_batch_units // dp
        per_group = []
        for group in groups:
            per_group.append([(tp, group.count // (tp * dp)) for tp in group.chip.tp_sizes()
                              if group.count % (tp * dp) == 0 and profiles[group.chip.name].layer(tp) is not None
                              and profiles[group.chip.name].update_s(dp, tp) is not None])
        for tp_pp in itertools.product(*per_group):
            tps = [tp for tp, _ in tp_pp]
            if monotone_tp and any(groups[g].chip.name == groups[g + 1].chip.name and tps[g] < tps[g + 1]
                                   for g in range(len(groups) - 1)):
                continue
            pps = [pp for _, pp in tp_pp]
            num_stages = sum(pps)
            if num_stages > total_layers:
                continue
            for recompute in itertools.product((False, True), repeat=len(groups)):
                for layers in compositions(total_layers, pps):
                    evaluated += 1
                    value = _score(groups, tps, pps, recompute, layers, dp, micro_batches, model, training, profiles)
                    if value is not None and (best is None or value < best.objective_s):
                        best = Candidate(objective_s=value, dp=dp, micro_batches=micro_batches, groups=tuple(groups),
                                         tps=tuple(tps), pps=tuple(pps), recompute=tuple(recompute),
                                         layers=tuple(layers))
    if best is None:
        raise UserError("no feasible strategy (exhaustive search)")
    return SearchResult(best=best, top=[best], evaluated=evaluated, bounded=0,
                        search_s=time.perf_counter() - started, stage1_dp=best.dp, stages_run=1,
                        search_cpu_s=time.process_time() - started_cpu)


def _score(groups, tps, pps, recompute, layers, dp, micro_batches, model, training, profiles) -> float | None:
    num_stages = sum(pps)
    compute, update = [], []
    position = 0
    for g, group in enumerate(groups):
        profile = profiles[group.chip.name]
        layer = profile.layer(tps[g])
        largest = -(-layers[g] // pps[g])
        base, extra = divmod(layers[g], pps[g])
        for s in range(pps[g]):
            memory = stage_memory_bytes(model, training, layer, dp=dp, recompute=recompute[g], position=position,
                                        num_stages=num_stages, micro_batches=micro_batches, layers=largest)
            if memory > group.chip.capacity_bytes:
                return None
            stage_layers = base + (1 if s >= pps[g] - extra else 0)
            compute.append(stage_layers * layer.compute_s(recompute[g]))
            update.append(stage_layers * profile.update_s(dp, tps[g]))
            position += 1
    return iteration_time_s(compute, update, micro_batches, training.alpha)
