"""HeteroAuto's search: the best plan of the space below under a cost model, by an exact dynamic
programme per (dp, grouping, stage order) with bounds that only skip what cannot win.

Space. dp divides the global batch (in micro-batches). Chip types form contiguous blocks of the
pipeline in any order (every permutation). A type is one group of chips, or (group_size) groups of
group_size chips (the last takes the rest), the paper's second stage; both groupings are searched, so
splitting never loses a plan the whole-type grouping had. Each group picks tp (count = pp * tp * dp)
and recompute; each stage of a group its own layer count (at least one), checked against memory at its
own position. With monotone_tp, tp may not grow along one type's groups (the paper's rule).

Method (layer_dp.py for the recursion): for one (dp, grouping, order) the cost is min over bounds M of
M + alpha * sum(M), where sum(M) is the least sum of per-micro-batch stage terms with every stage's max
term under M (a shortest path over groups placed from the pipeline's end). The bounds tried are the
finitely many values a stage weight takes; the smallest feasible one is found by bisection on a cheaper
recursion without the layer dimension, and larger ones are split in halves while
M_low + alpha * sum(M_high) (sum falls as M grows) can still beat the k-th best. Whole (dp, grouping)
items are skipped when a relaxation (M from a continuous cover of the layers, sum from the cheapest
possible layer times) cannot beat it, orders when they cannot fit the layers under the best M that could
still win. The worst case is the product of those counts, each polynomial: dps, k! orders (k <= 6 chip
types in practice), bounds (at most options x L), groups x options x (tails x layers) per recursion.

A time limit returns the best plan found with the bound it has proved: the least lower bound of the
work left (the plan is within best / bound - 1 of the optimum).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import PRESETS, ModelConfig
from h2.core.strategy import StageSpec, Strategy
from heteropp.auto.evaluation import evaluate_strategy
from heteropp.auto.memory import stage_memory_terms_at
from heteropp.auto.profiles import Profile
from heteropp.auto.stage_terms import check_cost_model, embedding_terms, head_terms, transfer_s
from heteropp.auto import layer_dp
from heteropp.auto.layer_dp import Option, OrderedGroups, StageVariantCaps

GB = 1e9
_TIE = 1 - 2e-9  # a bound within rounding of the incumbent cannot beat it by more than that: prune ties


# ---- the space -----------------------------------------------------------------------------------------
def prime_factors(n: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every divisor of n, sorted, from its factorisation (no scan over 1..n)."""
    result = [1]
    for prime, power in prime_factors(n).items():
        result = [d * prime ** e for d in result for e in range(power + 1)]
    return sorted(result)


@dataclass(frozen=True)
class Group:
    chip: ChipType
    count: int
    label: str


def type_groups(chip: ChipType, group_size: int | None) -> list[Group]:
    if not group_size or chip.count <= group_size:
        return [Group(chip=chip, count=chip.count, label=chip.name)]
    sizes = [group_size] * (chip.count // group_size) + ([chip.count % group_size] if chip.count % group_size else [])
    return [Group(chip=chip, count=size, label=f"{chip.name}#{i}") for i, size in enumerate(sizes)]


def groupings(cluster: ClusterSpec, group_size: int | None) -> list[dict[str, list[Group]]]:
    """Whole types, and (group_size) types split into groups, when that differs."""
    whole = {chip.name: type_groups(chip, None) for chip in cluster.chips}
    split = {chip.name: type_groups(chip, group_size) for chip in cluster.chips}
    return [whole] if split == whole else [whole, split]


def batch_dp_values(cluster: ClusterSpec, training: TrainingSpec, fixed_dp: int | None = None) -> list[int]:
    """The dp sizes that divide the global batch (in micro-batches) and, with some allowed tp, every chip
    count; fixed_dp (a user's choice) must be one of them, or the error names what it fails."""
    units = training.micro_batch_units
    if fixed_dp is not None:
        if fixed_dp < 1 or units % fixed_dp:
            raise UserError(f"--dp {fixed_dp}: must divide the global batch of {units} micro-batches "
                            f"({training.sequences} sequences / micro_batch_size {training.micro_batch_size})")
        for index, chip in enumerate(cluster.chips):
            if not any(chip.count % (tp * fixed_dp) == 0 for tp in chip.tp_sizes()):
                raise UserError(f"{cluster.source}: field 'chips[{index}].count': {chip.count} chips of type "
                                f"'{chip.name}' are not divisible by tp * dp for dp={fixed_dp} and any tp in "
                                f"{chip.tp_sizes()}")
        return [fixed_dp]
    common = math.gcd(*[chip.count for chip in cluster.chips])
    return [dp for dp in divisors(math.gcd(units, common))
            if all(any(chip.count % (tp * dp) == 0 for tp in chip.tp_sizes()) for chip in cluster.chips)]


# ---- results -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """One plan: dp, micro-batches, and per group (pipeline order) its tp, recompute and stage layers."""
    objective_s: float
    dp: int
    micro_batches: int
    groups: tuple[Group, ...]
    tps: tuple[int, ...]
    recompute: tuple[bool, ...]
    stage_layers: tuple[tuple[int, ...], ...]

    @property
    def pps(self) -> tuple[int, ...]:
        return tuple(len(stages) for stages in self.stage_layers)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sum(stages) for stages in self.stage_layers)

    @property
    def order(self) -> tuple[str, ...]:
        """Chip types in pipeline order."""
        names: list[str] = []
        for group in self.groups:
            if not names or names[-1] != group.chip.name:
                names.append(group.chip.name)
        return tuple(names)

    def to_strategy(self, model: ModelConfig, training: TrainingSpec, schedule: str = "1f1b") -> Strategy:
        stages = [StageSpec(chip=group.chip.name, tp=tp, layers=layers, recompute=recompute)
                  for group, tp, recompute, counts in zip(self.groups, self.tps, self.recompute, self.stage_layers)
                  for layers in counts]
        return Strategy(dp=self.dp, micro_batches=self.micro_batches, micro_batch_size=training.micro_batch_size,
                        stages=stages, model=model.name if PRESETS.get(model.name) == model else model.to_dict(),
                        schedule=schedule, seq_len=training.seq_len)


@dataclass
class SearchResult:
    best: Plan
    top: list[Plan]
    evaluated: int          # sum tables built (one per bound tried)
    bounded: int            # items, orders and bound ranges skipped by a bound
    search_s: float
    search_cpu_s: float
    lower_bound_s: float    # proved: no plan of the space is faster
    optimal: bool           # False when the time limit stopped the search
    orders: int = 0         # stage orders of the space (over every dp and grouping)

    @property
    def gap(self) -> float:
        """best / proved lower bound - 1: how far the returned plan can be from the optimum."""
        return self.best.objective_s / self.lower_bound_s - 1 if self.lower_bound_s > 0 else 0.0


@dataclass
class Progress:
    """What a long search reports: items (dp, grouping) and orders done, best and bound so far."""
    items_done: int
    items: int
    orders_done: int
    best_s: float
    lower_bound_s: float
    elapsed_s: float


@dataclass
class Infeasibility:
    """The tightest constraint seen failing, for the 'no feasible strategy' message."""
    depth: str | None = None
    memory_overflow: tuple[float, str] | None = None   # (needed / capacity, message) at one layer per stage
    memory_cover: tuple[float, str] | None = None      # (layers held / layers needed, message)
    profile: str | None = None

    def note_overflow(self, ratio: float, message: str) -> None:
        if self.memory_overflow is None or ratio < self.memory_overflow[0]:
            self.memory_overflow = (ratio, message)

    def note_cover(self, ratio: float, message: str) -> None:
        if self.memory_cover is None or ratio > self.memory_cover[0]:
            self.memory_cover = (ratio, message)

    def reason(self) -> str:
        if self.memory_cover is not None:
            return self.memory_cover[1]
        if self.memory_overflow is not None:
            return self.memory_overflow[1]
        return self.depth or self.profile or "no feasible strategy: no configuration to evaluate"


class _TimeUp(Exception):
    pass


# ---- one problem ---------------------------------------------------------------------------------------
@dataclass
class _Item:
    """One (dp, grouping): its groups per type, their options, and lower bounds for every plan in it:
    on the max term (cover_s), on the sum of per-micro-batch stage terms (floor_sum_s), and on T."""
    dp: int
    groups: dict[str, list[Group]]
    options: dict[tuple[str, int], list[Option]]
    cover_s: float = 0.0
    floor_sum_s: float = 0.0
    lower_bound_s: float = 0.0
    orders_left: int = 0


class Planner:
    def __init__(self, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile],
                 *, cost_model: str = "full", monotone_tp: bool = False):
        self.cluster, self.model, self.training, self.profiles = cluster, model, training, profiles
        self.cost_model = check_cost_model(cost_model)
        self.monotone_tp = monotone_tp
        self.infeasible = Infeasibility()
        self.evaluated = 0
        self.bounded = 0
        self._sends: dict = {}

    @property
    def full(self) -> bool:
        return self.cost_model == "full"

    # ---- options of one group --------------------------------------------------------------------------
    def group_options(self, group: Group, dp: int) -> list[Option]:
        chip, profile = group.chip, self.profiles[group.chip.name]
        total_layers = self.model.num_layers
        micro_batches = self.training.micro_batch_units // dp
        depth = 2 * total_layers + 2
        in_flight = np.minimum(np.arange(depth), micro_batches)
        options = []
        for tp in chip.tp_sizes():
            if group.count % (tp * dp):
                continue
            layer, update = profile.layer(tp), profile.update_s(dp, tp)
            if layer is None or update is None:
                self.infeasible.profile = (f"no feasible strategy: profile of chip '{chip.name}' lacks tp={tp} "
                                           f"or the update time at (dp={dp}, tp={tp})")
                continue
            pp = group.count // (tp * dp)
            if pp > total_layers:
                self.infeasible.depth = (f"no feasible strategy: every configuration has more pipeline stages than "
                                         f"the model's {total_layers} layers")
                continue
            first = embedding_terms(self.model, self.training, chip, profile, tp=tp, dp=dp,
                                    micro_batch_size=self.training.micro_batch_size) if self.full else None
            last = head_terms(self.model, self.training, chip, profile, layer, dp=dp,
                              micro_batch_size=self.training.micro_batch_size) if self.full else None
            inner_send = self.send_s(chip, tp, chip, tp, dp)
            for recompute in (False, True):
                caps = self._caps(chip, layer, dp, recompute, in_flight, total_layers)
                if not recompute and min(c[depth - 1] for c in (caps.middle, caps.first, caps.last)) >= total_layers:
                    options.append(self._option(tp, recompute, pp, layer, update, caps, first, last, inner_send))
                    break  # recompute would only cost time: every stage already holds every layer
                options.append(self._option(tp, recompute, pp, layer, update, caps, first, last, inner_send))
        return options

    def _option(self, tp, recompute, pp, layer, update, caps, first, last, inner_send) -> Option:
        return Option(tp=tp, recompute=recompute, pp=pp, compute_s=layer.compute_s(recompute), update_s=update,
                      caps=caps, first_extra_s=first.forward_s + first.backward_s if first else 0.0,
                      first_update_s=first.update_s if first else 0.0,
                      last_extra_s=last.forward_s + last.backward_s if last else 0.0,
                      last_update_s=last.update_s if last else 0.0, inner_send_s=inner_send)

    def _caps(self, chip: ChipType, layer, dp: int, recompute: bool, in_flight: np.ndarray, limit: int):
        def caps_for(first: bool, last: bool) -> np.ndarray:
            values = np.zeros(len(in_flight))
            memo: dict[int, int] = {}
            for d in range(1, len(in_flight)):
                held = int(in_flight[d])
                if held not in memo:
                    terms = stage_memory_terms_at(self.model, self.training, layer, dp=dp, recompute=recompute,
                                                  in_flight=held, first=first, last=last)
                    memo[held] = terms.max_layers(chip.capacity_bytes, limit)
                    if memo[held] < 1 and held == 1:
                        where = "the first stage" if first else "the last stage" if last else "a middle stage"
                        self.infeasible.note_overflow(terms.bytes(1) / chip.capacity_bytes, (
                            f"no feasible strategy: memory: the closest configuration (dp={dp}, chip {chip.name} "
                            f"tp={layer.tp} recompute={'on' if recompute else 'off'}, {where}) needs "
                            f"{terms.bytes(1) / GB:.1f} GB per chip for one layer, capacity "
                            f"{chip.capacity_bytes / GB:.1f} GB"))
                values[d] = memo[held]
            return values

        return StageVariantCaps(middle=caps_for(False, False), first=caps_for(True, False),
                                last=caps_for(False, True), both=caps_for(True, True))

    def send_s(self, chip_a: ChipType, tp_a: int, chip_b: ChipType, tp_b: int, dp: int) -> float:
        """One micro-batch between stages (0 under the paper's model)."""
        if not self.full:
            return 0.0
        key = (chip_a.name, tp_a, chip_b.name, tp_b, dp)
        if key not in self._sends:
            occupancy, latency = transfer_s(self.cluster, self.model, self.training,
                                            dp * self.training.micro_batch_size, chip_a, tp_a * dp, chip_b, tp_b * dp)
            self._sends[key] = occupancy + latency
        return self._sends[key]

    # ---- items, orders, bounds -----------------------------------------------------------------------
    def item(self, dp: int, groups: dict[str, list[Group]]) -> _Item | None:
        options: dict[tuple[str, int], list[Option]] = {}
        for name, type_list in groups.items():
            for group in type_list:
                key = (name, group.count)
                if key not in options:
                    options[key] = self.group_options(group, dp)
                if not options[key]:
                    return None
        if sum(len(v) for v in groups.values()) > self.model.num_layers:
            self.infeasible.depth = (f"no feasible strategy: every configuration has more pipeline stages than the "
                                     f"model's {self.model.num_layers} layers")
            return None
        item = _Item(dp=dp, groups=groups, options=options)
        item.cover_s = self.cover_bound(item)
        item.floor_sum_s = self.floor_sum(item)
        item.lower_bound_s = (item.cover_s + self.training.alpha * item.floor_sum_s) * _TIE
        return item

    def cover_bound(self, item: _Item) -> float:
        """A bound below every plan's max term: the least M whose continuous cover of the layers (every group
        at its best option, stages at their largest memory cap, no end or transfer terms) reaches L."""
        total, alpha = self.model.num_layers, self.training.alpha
        b_minus_alpha = self.training.micro_batch_units // item.dp - alpha
        groups = [item.options[(name, group.count)] for name, type_list in item.groups.items() for group in type_list]
        if sum(min(o.pp for o in options) for options in groups) > total:
            return math.inf

        def cover(bound: float) -> float:
            held = 0.0
            for options in groups:
                held += max(o.pp * min(o.caps.middle[1], bound / w if (w := b_minus_alpha * o.compute_s + o.update_s)
                                       > 0 else math.inf) for o in options)
            return held

        if cover(math.inf) < total:
            return math.inf
        low, high = 0.0, 1.0
        while cover(high) < total:
            high *= 2
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (low, middle) if cover(middle) >= total else (middle, high)
        return low

    def floor_sum(self, item: _Item) -> float:
        """A bound below every plan's sum of per-micro-batch stage terms: each type's fewest stages at its
        cheapest layer time, the other layers at the cheapest of all, the cheapest embedding and head."""
        every = [o for name, type_list in item.groups.items() for g in type_list for o in item.options[(name, g.count)]]
        stages = cheapest = 0.0
        for name, type_list in item.groups.items():
            least = sum(min(o.pp for o in item.options[(name, g.count)]) for g in type_list)
            stages += least
            cheapest += least * min(o.compute_s for g in type_list for o in item.options[(name, g.count)])
        ends = (min(o.first_extra_s for o in every) + min(o.last_extra_s for o in every)) if self.full else 0.0
        return (cheapest + (self.model.num_layers - stages) * min(o.compute_s for o in every) + ends) * _TIE

    def ordered(self, item: _Item, order: tuple[str, ...]) -> tuple[OrderedGroups, list[Group]]:
        groups = [group for name in order for group in item.groups[name]]
        options = [item.options[(group.chip.name, group.count)] for group in groups]
        boundary, same = [], []
        for g, group in enumerate(groups):
            if g == len(groups) - 1:
                boundary.append({})
                same.append(False)
                continue
            following = groups[g + 1]
            boundary.append({(a.tp, b.tp): self.send_s(group.chip, a.tp, following.chip, b.tp, item.dp)
                             for a in options[g] for b in options[g + 1]})
            same.append(following.chip.name == group.chip.name)
        problem = OrderedGroups(micro_batches=self.training.micro_batch_units // item.dp, alpha=self.training.alpha,
                                layers=self.model.num_layers, options=options, boundary_send_s=boundary,
                                same_type_next=same, monotone_tp=self.monotone_tp)
        return problem, groups


def _orders(cluster: ClusterSpec) -> list[tuple[str, ...]]:
    """Every order of the chip types, the paper's (larger usable memory first) first."""
    paper = tuple(c.name for c in cluster.by_descending_memory())
    return [paper] + [order for order in itertools.permutations(paper) if order != paper]


# ---- the search ----------------------------------------------------------------------------------------
class _Search:
    def __init__(self, planner: Planner, top_k: int, deadline: float | None,
                 progress: Callable[[Progress], None] | None, started: float):
        self.planner, self.top_k, self.deadline, self.progress = planner, top_k, deadline, progress
        self.started = started
        self.top: list[Plan] = []          # best first, one per (dp, grouping, order)
        self.items_done = self.orders_done = 0
        self.items = 0
        self.pending_bound = math.inf
        self._last_report = started

    def threshold(self) -> float:
        return self.top[self.top_k - 1].objective_s if len(self.top) >= self.top_k else math.inf

    def offer(self, plan: Plan) -> None:
        self.top.append(plan)
        self.top.sort(key=lambda p: p.objective_s)
        del self.top[self.top_k:]

    def tick(self, lower_bound: float) -> None:
        now = time.perf_counter()
        if self.deadline is not None and now > self.deadline:
            raise _TimeUp
        if self.progress is not None and now - self._last_report >= 1.0:
            self._last_report = now
            best = self.top[0].objective_s if self.top else math.inf
            self.progress(Progress(items_done=self.items_done, items=self.items, orders_done=self.orders_done,
                                   best_s=best, lower_bound_s=lower_bound, elapsed_s=now - self.started))

    # one (dp, grouping, order): min over bounds M of M + alpha * sum(M)
    def solve_order(self, item: _Item, order: tuple[str, ...]) -> None:
        planner = self.planner
        problem, groups = planner.ordered(item, order)
        alpha = problem.alpha
        threshold = self.threshold()
        candidates = layer_dp.bound_candidates(problem)
        highest = candidates[-1] if not math.isfinite(threshold) else threshold - alpha * item.floor_sum_s
        usable = candidates[candidates <= highest * (1 + 1e-12)] if math.isfinite(highest) else candidates
        if not len(usable) or not layer_dp.feasible(problem, float(usable[-1])):
            planner.bounded += 1
            if not math.isfinite(threshold):
                held = layer_dp.most_layers(problem, math.inf)
                if held >= 0:
                    planner.infeasible.note_cover(held / problem.layers, self._cover_message(item, order, held))
            return
        low, high = 0, len(usable) - 1
        while low < high:                                  # the least bound that fits every layer
            self.tick(item.lower_bound_s)
            middle = (low + high) // 2
            if layer_dp.feasible(problem, float(usable[middle])):
                high = middle
            else:
                low = middle + 1
        best = {"value": math.inf, "bound": None}

        def evaluate(index: int) -> float:
            self.tick(item.lower_bound_s)
            bound = float(usable[index])
            planner.evaluated += 1
            total = layer_dp.sum_tables(problem, bound).best()[0]
            value = bound + alpha * total
            if value < best["value"]:
                best["value"], best["bound"] = value, bound
            return total

        def limit() -> float:
            return min(self.threshold(), best["value"])

        first = evaluate(low)
        if alpha > 0 and len(usable) - 1 > low:
            last = evaluate(len(usable) - 1)
            stack = [(low, len(usable) - 1, first, last)]
            while stack:
                lo, hi, sum_lo, sum_hi = stack.pop()
                if hi - lo <= 1 or sum_lo <= sum_hi * (1 + 1e-12) or \
                        usable[lo + 1] + alpha * sum_hi >= limit() * _TIE:
                    if hi - lo > 1:
                        planner.bounded += 1
                    continue
                middle = (lo + hi) // 2
                sum_middle = evaluate(middle)
                stack += [(middle, hi, sum_middle, sum_hi), (lo, middle, sum_lo, sum_middle)]
        if best["bound"] is None or best["value"] >= self.threshold() * _TIE:
            return
        solved = layer_dp.sum_tables(problem, best["bound"])
        placed = layer_dp.rebuild(problem, solved)
        plan = self._plan(item, groups, placed)
        self.offer(plan)

    def _plan(self, item: _Item, groups: list[Group], placed: list[layer_dp.PlacedGroup]) -> Plan:
        planner = self.planner
        plan = Plan(objective_s=0.0, dp=item.dp, micro_batches=planner.training.micro_batch_units // item.dp,
                    groups=tuple(groups), tps=tuple(p.option.tp for p in placed),
                    recompute=tuple(p.option.recompute for p in placed),
                    stage_layers=tuple(tuple(p.stage_layers) for p in placed))
        report = evaluate_strategy(plan.to_strategy(planner.model, planner.training), planner.cluster, planner.model,
                                   planner.training, planner.profiles, cost_model=planner.cost_model)
        return Plan(**{**plan.__dict__, "objective_s": report.iteration_s})

    def _cover_message(self, item: _Item, order: tuple[str, ...], held: float) -> str:
        return (f"no feasible strategy: memory: the closest configuration (dp={item.dp}, stage order "
                f"{' > '.join(order)}, {sum(len(g) for g in item.groups.values())} groups) holds at most "
                f"{int(held)} of the model's {self.planner.model.num_layers} layers within memory")


def search(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile], *,
           cost_model: str = "full", top_k: int = 1, group_size: int | None = 128, dp: int | None = None,
           monotone_tp: bool = False, time_limit_s: float | None = None,
           progress: Callable[[Progress], None] | None = None) -> SearchResult:
    """The best plan of the space (module docstring); top_k: the best plans of distinct (dp, grouping,
    stage order); time_limit_s: stop then and return the best so far with its proved bound."""
    started, started_cpu = time.perf_counter(), time.process_time()
    planner = Planner(cluster, model, training, profiles, cost_model=cost_model, monotone_tp=monotone_tp)
    deadline = started + time_limit_s if time_limit_s is not None else None
    run = _Search(planner, top_k, deadline, progress, started)
    items = []
    for grouping in groupings(cluster, group_size):
        for dp_value in batch_dp_values(cluster, training, dp):
            item = planner.item(dp_value, grouping)
            if item is not None and math.isfinite(item.lower_bound_s):
                items.append(item)
    items.sort(key=lambda i: i.lower_bound_s)
    orders = _orders(cluster)
    run.items = len(items)
    for item in items:
        item.orders_left = len(orders)
    optimal = True
    try:
        for item in items:
            if item.lower_bound_s >= run.threshold() * _TIE:
                planner.bounded += 1
                run.items_done += 1
                item.orders_left = 0
                continue
            for order in orders:
                run.tick(item.lower_bound_s)
                run.solve_order(item, order)
                item.orders_left -= 1
                run.orders_done += 1
            run.items_done += 1
    except _TimeUp:
        optimal = False
    if not run.top:
        if not optimal:
            raise UserError(f"--time-limit {time_limit_s:g}: no feasible plan found within the time limit")
        raise UserError(planner.infeasible.reason())
    best = run.top[0]
    if optimal:
        lower = best.objective_s
    else:
        lower = min([best.objective_s] + [i.lower_bound_s for i in items if i.orders_left > 0])
    return SearchResult(best=best, top=list(run.top), evaluated=planner.evaluated, bounded=planner.bounded,
                        search_s=time.perf_counter() - started, search_cpu_s=time.process_time() - started_cpu,
                        lower_bound_s=lower, optimal=optimal, orders=len(items) * len(orders))
