"""The exhaustive oracle: every plan of the search's space, written out and scored one by one.

It shares no code with the search (no dynamic programme, no bounds, no candidate lists): for every dp
that divides the global batch (a plain scan), both groupings (whole chip types, and groups of
group_size chips), every order of the chip types, every tp and recompute per group and every split of
the layers over the stages (at least one each), it writes the strategy out and scores it with the
explicit scorer (evaluation.evaluate_strategy: memory of every stage at its position, the cost model).
Only for small clusters and models (`limit` bounds the number of plans).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Iterator

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import PRESETS, ModelConfig
from h2.core.strategy import StageSpec, Strategy
from heteroauto.evaluation import evaluate_strategy
from heteroauto.profiles import Profile

DEFAULT_LIMIT = 2_000_000


@dataclass(frozen=True)
class OracleResult:
    strategy: Strategy
    objective_s: float
    evaluated: int
    search_s: float
    search_cpu_s: float


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every vector of `parts` counts >= 1 summing to `total`."""
    if parts == 1:
        if total >= 1:
            yield (total, )
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first, ) + rest


def _chip_groups(chip: ChipType, group_size: int | None) -> list[int]:
    counts, left = [], chip.count
    while group_size and left > group_size:
        counts.append(group_size)
        left -= group_size
    return counts + [left]


def _space_size(cluster: ClusterSpec, layers: int, units: int, group_size: int | None) -> int:
    """An upper bound on the plans enumerated: dps x groupings x orders x options x layer splits."""
    options = math.prod(2 * len(c.tp_sizes()) for c in cluster.chips for _ in _chip_groups(c, group_size))
    dps = sum(1 for d in range(1, min(units, 10**6) + 1) if units % d == 0) if units <= 10**6 else units
    return dps * 2 * math.factorial(len(cluster.chips)) * options * math.comb(layers - 1, (layers - 1) // 2)


def oracle_search(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile], *,
                  cost_model: str = "full", group_size: int | None = None, dp: int | None = None,
                  monotone_tp: bool = False, limit: int = DEFAULT_LIMIT) -> OracleResult:
    started, started_cpu = time.perf_counter(), time.process_time()
    units = training.micro_batch_units
    if _space_size(cluster, model.num_layers, units, group_size) > limit:
        raise UserError(f"--exhaustive: the space is too large (limit {limit:.3g} plans); use it on small clusters "
                        "and models")
    model_field = model.name if PRESETS.get(model.name) == model else model.to_dict()
    best, evaluated = None, 0
    splits = [None] if not group_size else [None, group_size]
    for dp_value in ([dp] if dp is not None else [d for d in range(1, units + 1) if units % d == 0]):
        for split in splits:
            for order in itertools.permutations(cluster.chips):
                groups = [(chip, count) for chip in order for count in _chip_groups(chip, split)]
                choices = []
                for chip, count in groups:
                    choices.append([(tp, recompute) for tp in chip.tp_sizes() for recompute in (False, True)
                                    if count % (tp * dp_value) == 0 and profiles[chip.name].layer(tp) is not None
                                    and profiles[chip.name].update_s(dp_value, tp) is not None])
                for picked in itertools.product(*choices):
                    if monotone_tp and any(
                            groups[g][0].name == groups[g + 1][0].name and picked[g][0] < picked[g + 1][0]
                            for g in range(len(groups) - 1)):
                        continue
                    chips_per_stage = [(chip, tp, recompute) for (chip, count), (tp, recompute) in zip(groups, picked)
                                       for _ in range(count // (tp * dp_value))]
                    if len(chips_per_stage) > model.num_layers:
                        continue
                    for layers in compositions(model.num_layers, len(chips_per_stage)):
                        evaluated += 1
                        strategy = Strategy(
                            dp=dp_value, micro_batches=units // dp_value, micro_batch_size=training.micro_batch_size,
                            stages=[
                                StageSpec(chip=chip.name, tp=tp, layers=count, recompute=recompute)
                                for (chip, tp, recompute), count in zip(chips_per_stage, layers)
                            ], model=model_field, seq_len=training.seq_len)
                        report = evaluate_strategy(strategy, cluster, model, training, profiles, cost_model=cost_model)
                        if report.fits and (best is None or report.iteration_s < best[0]):
                            best = (report.iteration_s, strategy)
    if best is None:
        raise UserError("no feasible strategy (exhaustive search)")
    return OracleResult(strategy=best[1], objective_s=best[0], evaluated=evaluated,
                        search_s=time.perf_counter() - started, search_cpu_s=time.process_time() - started_cpu)
