"""The H2 paper's search procedure (section 4.3.3), reproduced with its shortcuts, so that its predictions
can be checked against the paper (`heteroauto search --search paper`, the default with --cost-model
paper). The default search (search.py) covers more: every stage order, every dp for the split groups,
tp in any order along a type, a layer count per stage.

Space. Chip groups in pipeline order (chip types by descending usable memory, Observation 4).
dp divides the global batch (in micro-batches); each group picks tp in {1, 2, ..., TP_MAX} with
count = pp * tp * dp, and recompute on or off; a group's layers are spread evenly over its stages.
Stage 1: one group per chip type. Stage 2: dp fixed to stage 1's choice, each type split into groups
of `group_size` chips, and within a type tp must not grow along the pipeline (the paper's rule).
Costs are the paper's model (stage_terms "paper"): max-term and alpha-term per group, solved exactly
per configuration by sharding.py.

Pruning that keeps the optimum of that space: a pipeline deeper than the model's layers is skipped;
recompute on is skipped for a group whose no-recompute memory cap already admits every layer it could
be given; subtrees, leaves and recompute choices are cut by lower bounds (relaxations: open groups at
their best tp and recompute, continuous or un-refined layer splits) that cannot beat the k-th best.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from heteroauto.memory import stage_memory_terms_at
from heteroauto.profiles import Profile
from heteroauto.search import Group, Infeasibility, Plan, SearchResult, batch_dp_values
from heteroauto.sharding import absorber_bound, lower_bound, shard_layers

GIB = 1e9
_TIE = 1 - 2e-9  # a bound within rounding of the k-th best cannot beat it by more than that: prune ties


@dataclass(frozen=True)
class Candidate:
    """One evaluated point: a parallel configuration and its optimal layer sharding."""
    objective_s: float
    dp: int
    micro_batches: int
    groups: tuple[Group, ...]
    tps: tuple[int, ...]
    pps: tuple[int, ...]
    recompute: tuple[bool, ...]
    layers: tuple[int, ...]

    def stage_layers(self) -> list[tuple[int, list[int]]]:
        """Per group, the layer count of each of its stages: even, with the extra layers on later stages
        (they hold fewer micro-batches in flight)."""
        result = []
        for g, (pp, layers) in enumerate(zip(self.pps, self.layers)):
            base, extra = divmod(layers, pp)
            result.append((g, [base] * (pp - extra) + [base + 1] * extra))
        return result

    def plan(self) -> Plan:
        return Plan(objective_s=self.objective_s, dp=self.dp, micro_batches=self.micro_batches, groups=self.groups,
                    tps=self.tps, recompute=self.recompute, stage_layers=tuple(
                        tuple(counts) for _, counts in self.stage_layers()))


def type_groups(cluster: ClusterSpec) -> list[Group]:
    return [Group(chip=chip, count=chip.count, label=chip.name) for chip in cluster.by_descending_memory()]


def split_groups(cluster: ClusterSpec, group_size: int) -> list[Group]:
    groups = []
    for chip in cluster.by_descending_memory():
        sizes = [group_size] * (chip.count // group_size)
        if chip.count % group_size:
            sizes.append(chip.count % group_size)
        if len(sizes) == 1:
            groups.append(Group(chip=chip, count=chip.count, label=chip.name))
        else:
            groups.extend(Group(chip=chip, count=size, label=f"{chip.name}#{i}") for i, size in enumerate(sizes))
    return groups


class Planner:
    """Evaluates configurations of one (cluster, model, training, profiles) problem.

    The DFS lists every (dp, tp per group) leaf with a lower bound (each group at its cheapest
    recompute setting with its largest memory cap); leaves are then solved in bound order, recompute
    choices by branch and bound, and a leaf whose bound cannot beat the k-th best is skipped. Bounds
    only relax the problem, so no skipped leaf holds a better strategy.
    """

    def __init__(self, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile]):
        self.cluster, self.model, self.training, self.profiles = cluster, model, training, profiles
        self.evaluated = 0
        self.bounded = 0
        self.infeasible = Infeasibility()
        self._caps: dict = {}
        self._options: dict = {}

    # ---- the pieces of one configuration -------------------------------------------------
    def tp_choices(self, group: Group, dp: int) -> list[tuple[int, int]]:
        """(tp, pp) with count = pp * tp * dp, profiled at this tp and (dp, tp)."""
        profile = self.profiles[group.chip.name]
        choices = []
        for tp in group.chip.tp_sizes():
            if group.count % (tp * dp):
                continue
            if profile.layer(tp) is None or profile.update_s(dp, tp) is None:
                self.infeasible.profile = (f"no feasible strategy: profile of chip '{group.chip.name}' lacks tp={tp} "
                                           f"or the update time at (dp={dp}, tp={tp})")
                continue
            choices.append((tp, group.count // (tp * dp)))
        return choices

    def memory_cap(self, chip: ChipType, tp: int, dp: int, recompute: bool, in_flight: int, first: bool,
                   last: bool) -> int:
        """Most layers a stage can hold; notes the overflow when not even one fits."""
        key = (chip.name, tp, dp, recompute, in_flight, first, last)
        cap = self._caps.get(key)
        if cap is None:
            layer = self.profiles[chip.name].layer(tp)
            terms = stage_memory_terms_at(self.model, self.training, layer, dp=dp, recompute=recompute,
                                          in_flight=in_flight, first=first, last=last)
            cap = self._caps[key] = terms.max_layers(chip.capacity_bytes, self.model.num_layers)
            if cap < 1:
                where = ("the first stage" if first else
                         "the last stage" if last else f"a stage with {in_flight} micro-batches in flight")
                self.infeasible.note_overflow(
                    terms.bytes(1) / chip.capacity_bytes,
                    (f"no feasible strategy: memory: the closest configuration (dp={dp}, chip {chip.name} tp={tp} "
                     f"recompute={'on' if recompute else 'off'}, {where}) needs {terms.bytes(1) / GIB:.1f} GB per "
                     f"chip for one layer, capacity {chip.capacity_bytes / GIB:.1f} GB"))
        return cap

    def options_at(self, group: Group, g: int, dp: int, micro_batches: int, tp: int, pp: int, tail: int,
                   last_group: bool, useful: int) -> tuple[list[tuple], tuple]:
        """Recompute options of group g (pipeline index) whose first stage has `tail` stages from it to the
        pipeline's end: (recompute, t, u, cap) for those that fit and are not dominated; and their
        relaxation (cheapest time and update, largest cap), which no real option beats."""
        in_flight = min(tail, micro_batches)
        key = (group.chip.name, tp, dp, pp, in_flight, g == 0, last_group, useful)
        cached = self._options.get(key)
        if cached is not None:
            return cached
        profile = self.profiles[group.chip.name]
        layer = profile.layer(tp)
        update = profile.update_s(dp, tp)
        choices = []
        for recompute in (False, True):
            cap = self.memory_cap(group.chip, tp, dp, recompute, in_flight, g == 0, last_group and pp == 1)
            if last_group and pp > 1:
                cap = min(cap, self.memory_cap(group.chip, tp, dp, recompute, 1, False, True))
            if cap >= 1:
                choices.append((recompute, layer.compute_s(recompute), update, cap))
                if not recompute and cap >= useful:
                    break  # recompute would only cost time
        relaxed = (None, min(o[1] for o in choices), min(o[2] for o in choices), max(o[3] for o in choices)) \
            if choices else None
        self._options[key] = (choices, relaxed)
        return choices, relaxed

    def _solve(self, pps, choice, micro_batches):
        return shard_layers(self.model.num_layers, pps, [o[1] for o in choice], [o[2] for o in choice],
                            [o[3] for o in choice], micro_batches, self.training.alpha)

    def solve_leaf(self, groups, dp, tps, pps, options, relaxed, heap, top_k) -> None:
        """Branch and bound over the recompute settings of one leaf."""
        micro_batches = self.training.micro_batch_units // dp
        choice = list(relaxed)

        def worst() -> float:
            return -heap[0][0] if len(heap) >= top_k else float("inf")

        def branch(g: int) -> None:
            if g == len(options):
                self.evaluated += 1
                solved = self._solve(pps, choice, micro_batches)
                if solved is None:
                    return
                value, layers = solved
                if value >= worst():
                    return
                candidate = Candidate(objective_s=value, dp=dp, micro_batches=micro_batches, groups=tuple(groups),
                                      tps=tuple(tps), pps=tuple(pps), recompute=tuple(o[0] for o in choice),
                                      layers=tuple(layers))
                entry = (-value, self.evaluated, candidate)
                if len(heap) < top_k:
                    heapq.heappush(heap, entry)
                else:
                    heapq.heapreplace(heap, entry)
                return
            for option in options[g]:
                choice[g] = option
                if len(options[g]) > 1 and g + 1 < len(options):
                    self.bounded += 1
                    bound = lower_bound(self.model.num_layers, pps, [o[1] for o in choice], [o[2] for o in choice],
                                        [o[3] for o in choice], micro_batches, self.training.alpha)
                    if bound >= worst() * _TIE:
                        continue
                branch(g + 1)
            choice[g] = relaxed[g]

        branch(0)

    # ---- the DFS -----------------------------------------------------------------------------
    def dfs(self, groups: list[Group], dp_values: list[int], monotone_tp: bool, heap: list, top_k: int) -> list:
        """Every leaf (dp, tp per group) with its options and a cheap lower bound (sharding.lower_bound).

        Groups are assigned from the pipeline's end backwards, so each group's stages-to-the-end, and
        with it the micro-batches its stages hold in flight, is known when it is chosen."""
        leaves = []
        total_layers = self.model.num_layers
        alpha = self.training.alpha
        last = len(groups) - 1
        for dp in dp_values:
            micro_batches = self.training.micro_batch_units // dp
            choices = [self.tp_choices(group, dp) for group in groups]
            if not all(choices):
                continue
            tps, pps = [0] * len(groups), [0] * len(groups)
            options, relaxed = [None] * len(groups), [None] * len(groups)

            open_absorbers: dict = {}

            def open_absorber(h: int, behind: int, min_tp: int) -> tuple:
                """Group h, not chosen yet, with at least `behind` stages after its own: the best it could be
                over its tp (>= min_tp) and recompute settings, as (least layers, layers per unit of max
                term, most layers, time per layer, weight)."""
                key = (h, behind, min_tp)
                if key not in open_absorbers:
                    best = [total_layers, 0.0, 0, float("inf"), float("inf")]
                    profile = self.profiles[groups[h].chip.name]
                    for tp, pp in choices[h]:
                        if tp < min_tp:
                            continue
                        t = profile.layer(tp).compute_s(False)
                        weight = (micro_batches - alpha) * t + profile.update_s(dp, tp)
                        in_flight = min(behind + pp, micro_batches)
                        cap = max(
                            self.memory_cap(groups[h].chip, tp, dp, recompute, in_flight, False, False)
                            for recompute in (False, True))
                        best = [
                            min(best[0], pp),
                            max(best[1], pp / weight if weight > 0 else float("inf")),
                            max(best[2], pp * cap),
                            min(best[3], t),
                            min(best[4], weight)
                        ]
                    open_absorbers[key] = tuple(best)
                return open_absorbers[key]

            def descend(g: int, tail: int, chosen: tuple) -> None:
                for tp, pp in choices[g]:
                    if (monotone_tp and g < last and groups[g + 1].chip.name == groups[g].chip.name
                            and tp < tps[g + 1]):
                        continue
                    if tail + pp + g > total_layers:
                        self.infeasible.depth = (f"no feasible strategy: every configuration has more pipeline "
                                                 f"stages than the model's {total_layers} layers")
                        continue
                    useful = -(-(total_layers - tail - g) // pp)
                    group_options, group_relaxed = self.options_at(groups[g], g, dp, micro_batches, tp, pp, tail + pp,
                                                                   g == last, useful)
                    if not group_options:
                        continue
                    tps[g], pps[g], options[g], relaxed[g] = tp, pp, group_options, group_relaxed
                    _, t, u, cap = group_relaxed
                    weight = (micro_batches - alpha) * t + u
                    absorbers = chosen + ((pp, pp / weight if weight > 0 else float("inf"), pp * cap, t, weight), )
                    if g > 0:
                        if len(heap) >= top_k:
                            same_type = groups[g].chip.name
                            open_groups = tuple(
                                open_absorber(h, tail + pp +
                                              (g - 1 -
                                               h), tp if monotone_tp and groups[h].chip.name == same_type else 0)
                                for h in range(g))
                            self.bounded += 1
                            if absorber_bound(total_layers, open_groups + absorbers, alpha) >= -heap[0][0] * _TIE:
                                continue
                        descend(g - 1, tail + pp, absorbers)
                        continue
                    self.bounded += 1
                    bound = lower_bound(total_layers, pps, [o[1] for o in relaxed], [o[2] for o in relaxed],
                                        [o[3] for o in relaxed], micro_batches, alpha)
                    if bound == float("inf"):
                        self._note_cover(groups, dp, tps, pps, relaxed)
                        continue
                    if len(heap) >= top_k and bound >= -heap[0][0] * _TIE:
                        continue
                    leaves.append((bound, dp, tuple(tps), tuple(pps), list(options), list(relaxed)))

            descend(last, 0, ())
        return leaves

    def _note_cover(self, groups, dp, tps, pps, relaxed) -> None:
        total_layers = self.model.num_layers
        held = sum(p * o[3] for p, o in zip(pps, relaxed))
        self.infeasible.note_cover(held / total_layers,
                                   (f"no feasible strategy: memory: the closest configuration (dp={dp}, " +
                                    ", ".join(f"{grp.label} tp={tp} pp={pp}" for grp, tp, pp in zip(groups, tps, pps)) +
                                    f") holds at most {held} of the model's {total_layers} layers within memory"))

    def run(self, groups: list[Group], dp_values: list[int], heap: list, top_k: int, monotone_tp: bool) -> None:
        leaves = self.dfs(groups, dp_values, monotone_tp, heap, top_k)
        leaves.sort(key=lambda leaf: leaf[0])
        for bound, dp, tps, pps, options, relaxed in leaves:
            if len(heap) >= top_k and bound >= -heap[0][0] * _TIE:
                break
            self.solve_leaf(groups, dp, tps, pps, options, relaxed, heap, top_k)


def search(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str,
                                                                                            Profile], *, top_k: int = 1,
           group_size: int | None = 128, refine_all_dp: bool = False, dp: int | None = None) -> SearchResult:
    """Stage 1 over chip types, then (group_size set) stage 2 over groups of group_size chips at stage 1's
    dp (or, refine_all_dp, at every dp: slower, and no longer loses when the grouped optimum's dp differs).
    dp fixes the data-parallel size."""
    started, started_cpu = time.perf_counter(), time.process_time()
    planner = Planner(cluster, model, training, profiles)
    heap: list = []
    dp_values = batch_dp_values(cluster, training, dp)
    planner.run(type_groups(cluster), dp_values, heap, top_k, monotone_tp=False)
    if not heap:
        raise UserError(planner.infeasible.reason())
    stage1_best = max(heap)[2]
    if group_size:
        groups = split_groups(cluster, group_size)
        if len(groups) > len(cluster.chips):
            planner.run(groups, dp_values if refine_all_dp else [stage1_best.dp], heap, top_k, monotone_tp=True)
    ranked = [entry[2].plan() for entry in sorted(heap, key=lambda e: -e[0])]
    return SearchResult(best=ranked[0], top=ranked, evaluated=planner.evaluated, bounded=planner.bounded,
                        search_s=time.perf_counter() - started, search_cpu_s=time.process_time() - started_cpu,
                        lower_bound_s=math.nan, optimal=False, orders=1)
