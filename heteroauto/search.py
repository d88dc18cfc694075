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
possible layer times) cannot beat it; that relaxation is solved only when the item comes up, items
waiting behind a quick bound from their options alone (Planner.quick_bound, never above it), and
orders when they cannot fit the layers under the best M that could still win. For the best plan
alone (top_k 1) every order is solved at once by orders_dp.py, a dynamic programme over the sets of
chip types already placed (k 2^(k-1) states instead of k! orders); top_k > 1 keeps one programme per
order (the best plan of each). In the layer recursion a state is cleared when a
state with fewer stages behind matches it (its memory caps are never tighter), when the groups still to
place cannot complete the layers under M, and, for a sum that only matters below a cap, when its sum plus
the least the remaining groups can add (one layer each, then the cheapest rates up to what each admits)
reaches the cap; the cap of an exact sum at M comes from the least M of the range it bounds. The worst
case is the product of polynomial counts: dps, bounds (at most options x L), k^2 2^k type placements,
groups x options x (tails x layers) per placement.

A time limit returns the best plan found with the bound it has proved: the least lower bound of the
work left (the plan is within best / bound - 1 of the optimum).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.model_config import PRESETS, ModelConfig
from h2.core.numbers import divisors
from h2.core.strategy import StageSpec, Strategy
from heteroauto import layer_dp
from heteroauto.evaluation import evaluate_strategy
from heteroauto.layer_dp import _ROUND, Option, OrderedGroups, StageVariantCaps
from heteroauto.memory import stage_caps_table, stage_memory_terms_at
from heteroauto.orders_dp import AllOrders
from heteroauto.profiles import Profile
from heteroauto.stage_terms import check_cost_model, embedding_terms, head_terms, transfer_s

GB = 1e9
MAX_LAYERS = 1024  # the sum tables are (tp, stages, layers) arrays: quadratic in the layers
_QUICK_MARGIN = 1 - 1e-9  # quick bounds shrunk by this: rounding cannot lift them above a plan's cost
_TIE = 1 - 2e-9  # a bound within rounding of the incumbent cannot beat it by more than that: prune ties
_GALLOP = 16  # least_bound gallops past the near candidates when the rest is this many times longer
_ENDS = [(False, False), (True, False), (False, True), (True, True)]  # (first, last) kinds of a stage


# ---- the space -----------------------------------------------------------------------------------------
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
    return [
        dp for dp in divisors(math.gcd(units, common)) if all(
            any(chip.count % (tp * dp) == 0 for tp in chip.tp_sizes()) for chip in cluster.chips)
    ]


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
        stages = [
            StageSpec(chip=group.chip.name, tp=tp, layers=layers, recompute=recompute)
            for group, tp, recompute, counts in zip(self.groups, self.tps, self.recompute, self.stage_layers)
            for layers in counts
        ]
        return Strategy(dp=self.dp, micro_batches=self.micro_batches, micro_batch_size=training.micro_batch_size,
                        stages=stages, model=model.name if PRESETS.get(model.name) == model else model.to_dict(),
                        schedule=schedule, seq_len=training.seq_len)


@dataclass
class SearchResult:
    best: Plan
    top: list[Plan]
    evaluated: int  # sum tables built (one per bound tried)
    bounded: int  # items, orders and bound ranges skipped by a bound
    search_s: float
    search_cpu_s: float
    lower_bound_s: float  # proved: no plan of the space is faster
    optimal: bool  # False when the time limit stopped the search
    orders: int = 0  # stage orders of the space
    timed_out: bool = False

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
    memory_overflow: tuple[float, str] | None = None  # (needed / capacity, message) at one layer per stage
    memory_cover: tuple[float, str] | None = None  # (layers held / layers needed, message)
    profile: str | None = None

    def note_overflow(self, ratio: float, message: str) -> None:
        if self.memory_overflow is None or ratio < self.memory_overflow[0]:
            self.memory_overflow = (ratio, message)

    def note_cover(self, ratio: float, message: str) -> None:
        if self.memory_cover is None or ratio > self.memory_cover[0]:
            self.memory_cover = (ratio, message)

    def reason(self) -> str:
        """Every constraint that ruled configurations out, the structural ones (stage count, profile) first:
        a memory message alone would hide that the stage count ruled out the configurations memory did not."""
        prefix = "no feasible strategy: "
        memory = (self.memory_cover or self.memory_overflow or (None, None))[1]
        structural = [text.removeprefix(prefix) for text in (self.depth, self.profile) if text]
        if memory and structural:
            return (prefix + "; ".join(
                text.replace("every configuration has", "some configurations have")
                for text in structural) + "; the others fail on " + memory.removeprefix(prefix))
        return memory or (prefix + "; ".join(structural) if structural else prefix + "no configuration to evaluate")


class _TimeUp(Exception):
    pass


# ---- one problem ---------------------------------------------------------------------------------------
@dataclass
class _Item:
    """One (dp, grouping): its groups per type and their options."""
    dp: int
    groups: dict[str, list[Group]]
    options: dict[tuple[str, int], list[Option]]
    lower_bound_s: float = 0.0  # below every plan of the item (order-free relaxation)
    quick_least: float = 0.0  # no M below this fits (Planner.quick_bound)
    pending: list = field(default_factory=list)  # (lower bound, kind, key, least M, floor) of work not done yet
    problems: dict = field(default_factory=dict)  # ordered problems built so far
    shared: dict = field(default_factory=dict)  # group shapes shared by those problems (layer_dp.native_shape)
    cheapest_from: dict = field(default_factory=dict)  # (chip type, tp) -> Planner._cheapest_from
    bounded: bool = False

    def most_stages(self) -> int:
        """The most pipeline stages any plan of the item has: every group at its deepest option."""
        return sum(
            max(o.pp for o in self.options[(name, group.count)]) for name, groups in self.groups.items()
            for group in groups)


class Planner:
    """Options of every group, ordered problems (exact or relaxed) of one (dp, grouping, stage order)."""

    def __init__(self, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile],
                 *, cost_model: str = "full", monotone_tp: bool = False):
        self.cluster, self.model, self.training, self.profiles = cluster, model, training, profiles
        self.cost_model = check_cost_model(cost_model)
        self.monotone_tp = monotone_tp
        self.infeasible = Infeasibility()
        self.evaluated = 0
        self.bounded = 0
        self._sends: dict = {}
        self._options: dict = {}
        self._caps: dict = {}
        self._cap_tables: dict = {}

    @property
    def full(self) -> bool:
        return self.cost_model == "full"

    # ---- options of one group --------------------------------------------------------------------------
    def group_options(self, group: Group, dp: int) -> list[Option]:
        key = (group.chip.name, group.count, dp)
        if key not in self._options:
            self._options[key] = self._group_options(group, dp)
        return self._options[key]

    def _group_options(self, group: Group, dp: int) -> list[Option]:
        chip, profile = group.chip, self.profiles[group.chip.name]
        total_layers = self.model.num_layers
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
            for recompute in (False, True):
                caps = self.caps(chip, layer, dp, recompute)
                options.append(
                    Option(tp=tp, recompute=recompute, pp=pp, compute_s=layer.compute_s(recompute), update_s=update,
                           caps=caps, first_extra_s=first.forward_s + first.backward_s if first else 0.0,
                           first_update_s=first.update_s if first else 0.0,
                           last_extra_s=last.forward_s + last.backward_s if last else 0.0, last_update_s=last.update_s
                           if last else 0.0, inner_send_s=self.send_s(chip, tp, chip, tp, dp)))
                if not recompute and caps.fewest() >= total_layers:
                    break  # recompute would only cost time: every stage already holds every layer
        return options

    def caps(self, chip: ChipType, layer, dp: int, recompute: bool) -> StageVariantCaps:
        key = (chip.name, layer.tp, dp, recompute)
        if key in self._caps:
            return self._caps[key]
        if key not in self._cap_tables:
            self._cap_tables.update(self._chip_cap_tables(chip, dp))
        variants = dict(zip(_ENDS, self._cap_tables[key]))
        for first, last in _ENDS:
            if variants[(first, last)][1] < 1:
                terms = stage_memory_terms_at(self.model, self.training, layer, dp=dp, recompute=recompute, in_flight=1,
                                              first=first, last=last)
                where = "the first stage" if first else "the last stage" if last else "a middle stage"
                self.infeasible.note_overflow(
                    terms.bytes(1) / chip.capacity_bytes,
                    (f"no feasible strategy: memory: the closest configuration (dp={dp}, chip {chip.name} "
                     f"tp={layer.tp} recompute={'on' if recompute else 'off'}, {where}) needs "
                     f"{terms.bytes(1) / GB:.1f} GB per chip for one layer, "
                     f"capacity {chip.capacity_bytes / GB:.1f} GB"))
        self._caps[key] = StageVariantCaps(middle=variants[(False, False)], first=variants[(True, False)],
                                           last=variants[(False, True)], both=variants[(True, True)])
        return self._caps[key]

    def _chip_cap_tables(self, chip: ChipType, dp: int) -> dict[tuple, np.ndarray]:
        """The memory caps of every profiled tp of `chip` at `dp`, with and without recompute, in one call
        (caps asks for them one by one): per (chip, tp, dp, recompute), by stage kind (_ENDS) and distance."""
        profile, total = self.profiles[chip.name], self.model.num_layers
        variants = [(profile.layer(tp), recompute) for tp in profile.tp_sizes() for recompute in (False, True)]
        in_flight = np.minimum(np.arange(2 * total + 2), self.training.micro_batch_units // dp)
        in_flight[0] = 1  # distance 0 is never read
        table = stage_caps_table(self.model, self.training, variants, dp=dp, in_flight=in_flight, ends=_ENDS,
                                 capacity=chip.capacity_bytes, limit=total)
        return {(chip.name, layer.tp, dp, recompute): rows for (layer, recompute), rows in zip(variants, table)}

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

    # ---- items and their ordered problems --------------------------------------------------------------
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
        return _Item(dp=dp, groups=groups, options=options)

    def quick_bound(self, item: _Item) -> tuple[float, float]:
        """(least M, bound): lower bounds on every plan of the item from its options alone, never above
        bound_item's (its least M that fits, and its bound): a plan
        whose stage weights are at most M holds at most min(memory cap, M / A) layers on each of a group's
        stages (a stage's fixed weight and its position only lower that), and its sum of stage terms is
        at least the layers at the least time of a layer. The least M at which the groups' best options
        hold every layer, and that plus alpha times that sum, shrunk by a rounding margin; 0 when
        alpha > b (fixed weights may then be negative)."""
        micro_batches = self.training.micro_batch_units // item.dp
        alpha, layers = self.training.alpha, self.model.num_layers
        if micro_batches < alpha:
            return 0.0, 0.0
        groups = [item.options[(group.chip.name, group.count)] for groups in item.groups.values() for group in groups]
        every = [option for options in groups for option in options]
        owner = np.repeat(np.arange(len(groups)), [len(options) for options in groups])
        pp = np.array([option.pp for option in every], dtype=float)
        cap = np.array([float(option.caps.middle[1:].max()) for option in every])
        weight = np.array([(micro_batches - alpha) * option.compute_s + option.update_s for option in every])
        positive = np.where(weight > 0, weight, 1.0)

        def held(bound: float) -> float:
            per = np.where(weight > 0, np.floor(bound / positive * (1 + _ROUND) + _ROUND), cap)
            per = np.minimum(per, cap)
            best = np.full(len(groups), -math.inf)
            np.maximum.at(best, owner, np.where(per >= 1, pp * per, -math.inf))
            return float(best.sum())

        if held(math.inf) < layers:
            return math.inf, math.inf
        steps = [weight[i] * np.arange(1, int(min(cap[i], layers)) + 1) for i in range(len(every)) if weight[i] > 0]
        values = np.unique(np.concatenate(steps + [np.zeros(1)]))  # where a stage's layer count can change
        low, high = 0, len(values) - 1
        if held(float(values[high])) < layers:
            return 0.0, 0.0  # fits only past every step: no bound (cannot happen with positive weights)
        while low < high:
            middle = (low + high) // 2
            if held(float(values[middle])) >= layers:
                high = middle
            else:
                low = middle + 1
        least_rate = min(option.compute_s for option in every)
        least = float(values[low])
        return least * _QUICK_MARGIN, (least + alpha * layers * least_rate) * _QUICK_MARGIN

    def ordered(self, item: _Item, order: tuple[str, ...],
                level: str = "exact") -> tuple[OrderedGroups, list[Group], float]:
        """The problem of one stage order at a level of relaxation, its groups, and a constant to add to
        the sum of stage terms. Levels, each a relaxation of the one before (only lowers the cost):
          exact: the cost model;
          order: memory caps by the stage's position in its group only (not in the pipeline);
          last:  also the embedding off the first stage (its time the cheapest of any type, in the sum)
                 and a type boundary's transfer the cheapest to any other type: the same for every order
                 with this last type;
          item:  also the head off the last stage and type boundaries free (the cheapest transfer of any
                 pair in the sum): the same for every order."""
        key = (order, level)
        if key not in item.problems:
            item.problems[key] = self._ordered(item, order, level)
        return item.problems[key]

    def _ordered(self, item: _Item, order: tuple[str, ...], level: str) -> tuple[OrderedGroups, list[Group], float]:
        groups = [group for name in order for group in item.groups[name]]
        options = [item.options[(group.chip.name, group.count)] for group in groups]
        every = [o for group_options in item.options.values() for o in group_options]
        constant = 0.0
        if level in ("last", "item"):
            constant += min(o.first_extra_s for o in every)
            if level == "item":
                constant += min(o.last_extra_s for o in every)
                constant += 2 * (len(order) - 1) * self._cheapest_crossing(item)
            options = [[_without_ends(o, head_too=level == "item") for o in group_options] for group_options in options]
        problem = self._problem(item, groups, options, level)
        return problem, groups, constant

    def all_orders(self, item: _Item) -> AllOrders:
        """Every stage order of the item at once (orders_dp), exact cost model."""
        key = ("every order", )
        if key not in item.problems:
            tp_values = sorted({o.tp for options in item.options.values() for o in options})
            chains: dict = {}

            def chain(name: str, following: str | None, starts: bool) -> OrderedGroups:
                if (name, following, starts) not in chains:
                    groups = item.groups[name] + (item.groups[following][:1] if following else [])
                    options = [item.options[(group.chip.name, group.count)] for group in groups]
                    chains[(name, following,
                            starts)] = self._problem(item, groups, options, "exact", tp_values=tp_values,
                                                     starts_pipeline=starts, follower=following is not None)
                return chains[(name, following, starts)]

            item.problems[key] = AllOrders(types=tuple(item.groups), chain=chain, alpha=self.training.alpha,
                                           layers=self.model.num_layers)
        return item.problems[key]

    def _problem(self, item: _Item, groups: list[Group], options: list[list[Option]], level: str,
                 **chain) -> OrderedGroups:
        """The ordered problem of `groups` (with their options) at a level of relaxation (see ordered)."""
        boundary, same = [], []
        for g, group in enumerate(groups):
            if g == len(groups) - 1:
                boundary.append({})
                same.append(False)
                continue
            following = groups[g + 1]
            same_type = following.chip.name == group.chip.name
            sends = {}
            for tp_a in dict.fromkeys(o.tp for o in options[g]):  # options differ in recompute: each tp once
                for tp_b in dict.fromkeys(o.tp for o in options[g + 1]):
                    if same_type or level in ("exact", "order"):
                        sends[(tp_a, tp_b)] = self.send_s(group.chip, tp_a, following.chip, tp_b, item.dp)
                    else:
                        sends[(tp_a, tp_b)] = 0.0 if level == "item" else self._cheapest_from(item, group.chip, tp_a)
            boundary.append(sends)
            same.append(same_type)
        return OrderedGroups(micro_batches=self.training.micro_batch_units // item.dp, alpha=self.training.alpha,
                             layers=self.model.num_layers, options=options, boundary_send_s=boundary,
                             same_type_next=same, monotone_tp=self.monotone_tp, relaxed=level != "exact",
                             shared=item.shared, most_stages=item.most_stages(), **chain)

    def _cheapest_from(self, item: _Item, chip: ChipType, tp: int) -> float:
        """The cheapest transfer from a stage of `chip` at `tp` to a stage of any other type."""
        key = (chip.name, tp)
        if key not in item.cheapest_from:
            item.cheapest_from[key] = min(
                self.send_s(chip, tp, other.chip, option.tp, item.dp) for name, groups in item.groups.items()
                if name != chip.name for other in groups for option in item.options[(name, other.count)])
        return item.cheapest_from[key]

    def _cheapest_crossing(self, item: _Item) -> float:
        """The cheapest transfer between stages of two different types."""
        return min((self._cheapest_from(item, groups[0].chip, option.tp) for name, groups in item.groups.items()
                    for option in item.options[(name, groups[0].count)]), default=0.0) if len(item.groups) > 1 else 0.0


def _without_ends(option: Option, head_too: bool) -> Option:
    """The option with the embedding (and head_too: the head) taken off its end stages: no time, and
    the memory of a middle stage, so that which type holds the ends no longer matters."""
    caps = option.caps
    caps = StageVariantCaps(middle=caps.middle, first=caps.middle, last=caps.middle if head_too else caps.last,
                            both=caps.middle if head_too else caps.last)
    ends = {"last_extra_s": 0.0, "last_update_s": 0.0} if head_too else {}
    return dataclasses.replace(option, first_extra_s=0.0, first_update_s=0.0, caps=caps, **ends)


def _above(total: float) -> float:
    """A cap just above a least sum: a trace of that sum (tolerance 1e-9 of it) reads only entries whose sum
    plus the least the rest adds is below it, so a sweep under this cap keeps every one it could read."""
    return total * (1 + 1e-6) + 1e-9 if math.isfinite(total) else math.inf


def _covers(split: _Item, whole: _Item) -> bool:
    """Whether every plan of the whole-type item is also one of the split item: each type's groups offer
    every (tp, recompute) the whole type does."""
    for name, (group, ) in whole.groups.items():
        wanted = {(o.tp, o.recompute) for o in whole.options[(name, group.count)]}
        for part in split.groups[name]:
            if not wanted <= {(o.tp, o.recompute) for o in split.options[(name, part.count)]}:
                return False
    return True


def _orders(cluster: ClusterSpec) -> list[tuple[str, ...]]:
    """Every order of the chip types, the paper's (larger usable memory first) first."""
    paper = tuple(c.name for c in cluster.by_descending_memory())
    return [paper] + [order for order in itertools.permutations(paper) if order != paper]


# ---- solving one problem: min over bounds M of M + alpha * sum(M) --------------------------------------
class _Search:

    def __init__(self, planner: Planner, top_k: int, gap: float, time_limit_s: float | None,
                 progress: Callable[[Progress], None] | None):
        self.planner, self.top_k, self.gap = planner, top_k, gap
        self.started_cpu = time.process_time()
        self.started = time.perf_counter()
        self.time_limit_s, self.progress = time_limit_s, progress
        self.top: list[Plan] = []  # best first, one per (dp, grouping, order)
        self.items: list[_Item] = []
        self.items_done = self.orders_done = 0
        self._last_report = self.started

    def threshold(self) -> float:
        """What a plan must beat to matter: the k-th best, shrunk by the accepted gap."""
        if len(self.top) < self.top_k:
            return math.inf
        return self.top[self.top_k - 1].objective_s / (1 + self.gap) * _TIE

    def offer(self, plan: Plan) -> None:
        self.top.append(plan)
        self.top.sort(key=lambda p: p.objective_s)
        del self.top[self.top_k:]

    def lower_bound(self) -> float:
        pending = [bound for item in self.items for bound, *_ in item.pending]
        return min(pending, default=math.inf)

    def tick(self) -> None:
        if self.time_limit_s is not None and time.process_time() - self.started_cpu > self.time_limit_s:
            raise _TimeUp
        now = time.perf_counter()
        if self.progress is not None and now - self._last_report >= 1.0:
            self._last_report = now
            self.progress(
                Progress(items_done=self.items_done, items=len(self.items), orders_done=self.orders_done,
                         best_s=self.top[0].objective_s if self.top else math.inf, lower_bound_s=min(
                             self.lower_bound(),
                             self.top[0].objective_s if self.top else math.inf), elapsed_s=now - self.started))

    def least_bound(self, problem: OrderedGroups | AllOrders, candidates: np.ndarray) -> int | None:
        """Index of the least candidate M under which every layer fits (None: not even the last)."""
        if not len(candidates):
            return None
        # near the start, gallop up from it then bisect; else (the last candidate fitting: asked only when the
        # near part does not fit) bisect the rest, or, when the rest is long, first gallop on from the near
        # part, the index doubling: the least M is mostly a little past it (fitting only grows with M)
        near = math.isqrt(len(candidates) - 1)
        if problem.feasible(float(candidates[near])):
            low, step = 0, 1
            while not problem.feasible(float(candidates[min(low + step - 1, near)])):
                self.tick()
                low, step = low + step, step * 2
            high = min(low + step - 1, near)
        elif near == len(candidates) - 1 or not problem.feasible(float(candidates[-1])):
            return None
        else:
            unfit, last = near, len(candidates) - 1
            gallop = last - near > _GALLOP * near
            while gallop and (probe := min(2 * unfit + 1,
                                           last)) < last and not problem.feasible(float(candidates[probe])):
                self.tick()
                unfit = probe
            low, high = unfit + 1, probe if gallop else last
        while low < high:
            self.tick()
            middle = (low + high) // 2
            if problem.feasible(float(candidates[middle])):
                high = middle
            else:
                low = middle + 1
        return low

    def candidates(self, problem: OrderedGroups | AllOrders, start: float, floor_sum: float) -> np.ndarray:
        """The M worth trying: from `start` (a proved least M) to what can still beat the threshold."""
        values = problem.bound_values()
        values = values[values >= start * (1 - 1e-12)]
        threshold = self.threshold()
        if math.isfinite(threshold):
            values = values[values + problem.alpha * floor_sum < threshold]
        return values

    def bound(self, problem: OrderedGroups | AllOrders, start: float, floor_sum: float) -> tuple[float, float]:
        """(least M that fits, least M + alpha * floor): a lower bound on the problem's cost; inf when it
        cannot beat the threshold."""
        candidates = self.candidates(problem, start, floor_sum)
        low = self.least_bound(problem, candidates)
        if low is None:
            return math.inf, math.inf
        least = float(candidates[low])
        return least, least + problem.alpha * floor_sum

    def solve(self, problem: OrderedGroups | AllOrders, relaxed_sum: Callable[[float, float],
                                                                              float], *, start: float, floor_sum: float,
              on_better: Callable[[float, float], None] | None = None) -> tuple[float, float | None, float]:
        """(min over M of M + alpha * sum(M), the M that gives it, its sum), skipping what cannot beat the
        threshold.

        sum(M) falls as M grows, so M_low + alpha * sum(M_high) bounds every M in between; ranges are split
        in halves, first bounded by a relaxed problem's sum (relaxed_sum(M, cap): cheap, never above the
        exact one, a value >= cap only a bound), and evaluated exactly only where that bound can still win.
        on_better(M, sum): called with each better M."""
        alpha = problem.alpha
        candidates = self.candidates(problem, start, floor_sum)
        low = self.least_bound(problem, candidates)
        if low is None:
            return math.inf, None, math.inf
        best = {"value": math.inf, "bound": None, "sum": math.inf}

        def exact(index: int, lowest: int) -> tuple[float, bool]:
            """(sum under the candidate, whether exact): a sum that cannot win is only bounded below. The sum
            is asked for the candidates from `lowest` to `index` (it bounds theirs from beneath)."""
            self.tick()
            bound = float(candidates[index])
            self.planner.evaluated += 1
            # a sum at or above this cap lets no candidate in lowest..index win: only bounded below
            cap = (limit() - float(candidates[lowest])) / alpha if alpha > 0 else math.inf
            total = problem.least_sum(bound, cap)
            if total >= cap:
                return cap, False
            if bound + alpha * total < best["value"]:
                best["value"], best["bound"], best["sum"] = bound + alpha * total, bound, total
                if on_better is not None:
                    on_better(bound, total)
            return total, True

        def limit() -> float:
            return min(self.threshold(), best["value"]) * _TIE

        first, first_exact = exact(low, low)
        if alpha == 0:
            return best["value"], best["bound"], best["sum"]
        # (lo, hi): the candidates strictly between are open; the sums at lo and hi are exact or lower bounds
        # ranges best first (least lower bound M_low + alpha * sum_hi): an early good plan bounds the others
        stack: list = []

        def push(lo: int, hi: int, sum_lo: float, lo_exact: bool, sum_hi: float, hi_exact: bool) -> None:
            if hi - lo > 1:
                heapq.heappush(stack,
                               (float(candidates[lo + 1]) + alpha * sum_hi, lo, hi, sum_lo, lo_exact, sum_hi, hi_exact))

        push(low, len(candidates), first, first_exact, floor_sum, False)  # hi: a sentinel at the floor
        while stack:
            _, lo, hi, sum_lo, lo_exact, sum_hi, hi_exact = heapq.heappop(stack)
            useful = int(np.searchsorted(candidates, limit() - alpha * floor_sum))  # from here none can win
            if useful < hi:  # sum_hi still bounds every sum below hi from beneath (sums fall as M grows)
                hi, hi_exact = useful, False
            if hi - lo <= 1:
                continue
            if candidates[lo + 1] + alpha * sum_hi >= limit() or (lo_exact and hi_exact and sum_lo <= sum_hi *
                                                                  (1 + 1e-12)):
                self.planner.bounded += 1
                continue
            middle = (lo + hi) // 2
            self.tick()
            # the relaxed sum matters only below what prunes (lo, middle] (a margin over it: a sum only
            # bounded there prunes as surely as the exact one would)
            prunes = (limit() * (1 + 1e-9) - float(candidates[lo + 1])) / alpha
            lower = max(sum_hi, relaxed_sum(float(candidates[middle]), prunes))
            if candidates[lo + 1] + alpha * lower >= limit():  # (lo, middle] cannot win
                self.planner.bounded += 1
                push(middle, hi, lower, False, sum_hi, hi_exact)
                continue
            sum_middle, middle_exact = exact(middle, lo + 1)
            push(middle, hi, sum_middle, middle_exact, sum_hi, hi_exact)
            push(lo, middle, sum_lo, lo_exact, sum_middle, middle_exact)
        return best["value"], best["bound"], best["sum"]

    def floor(self, problem: OrderedGroups | AllOrders, start: float = -math.inf) -> float:
        """The least sum of stage terms at any M (the sum tables with memory the only limit). With start (a
        proved least M), a sum that lets no M from start beat the threshold is only bounded below (inf)."""
        self.tick()
        self.planner.evaluated += 1
        cap = (self.threshold() - start) / problem.alpha if problem.alpha > 0 else math.inf
        return problem.least_sum(math.inf, cap if math.isfinite(start) and cap > 0 else math.inf)

    # ---- the items: quick bounds, relaxed bounds, exact orders -------------------------------------------
    def run_items(self, orders: list[tuple[str, ...]]) -> None:
        """Every item in the order of its relaxed bound (bound_item), each bounded only when it comes up:
        items wait behind their quick bound (quick_bound: never above the relaxed one, so the items run in
        the same order as if every relaxed bound were known first), and those whose quick bound cannot beat
        the best plan found by then are never bounded further."""
        for item in self.items:
            self.tick()
            item.quick_least, item.lower_bound_s = self.planner.quick_bound(item)
        queue = [(item.lower_bound_s, index, False) for index, item in enumerate(self.items)]
        heapq.heapify(queue)
        while queue:
            bound, index, relaxed = heapq.heappop(queue)
            item = self.items[index]
            self.tick()
            if not relaxed:
                if bound >= self.threshold() and math.isfinite(self.threshold()):
                    self.planner.bounded += 1  # proved by the quick bound alone
                    item.bounded = True
                    continue
                self.bound_item(item, orders)
                heapq.heappush(queue, (item.lower_bound_s, index, True))
                continue
            self.run_item(item, orders)
            self.items_done += 1

    # ---- one item: relaxed bounds first, exact orders last ---------------------------------------------
    def bound_item(self, item: _Item, orders: list[tuple[str, ...]]) -> None:
        """Every order at once: memory caps by position in the group, cheapest type boundaries, head and
        embedding as the cheapest of any type (the order of the types then no longer matters)."""
        problem, _, constant = self.planner.ordered(item, orders[0], "item")
        floor = self.floor(problem) + constant
        least, bound = self.bound(problem, item.quick_least, floor)
        item.lower_bound_s, item.bounded = bound, True
        if math.isfinite(bound):
            if self.top_k == 1:  # the best plan only: every order in one programme
                item.pending = [(bound, "every order", None, least, floor)]
            else:  # the best of each order: orders bounded by their last type, then one by one
                item.pending = [(bound, "last", name, least, floor) for name in item.groups]
            return
        self.planner.bounded += 1
        self.note_cover(item, orders[0])

    def note_cover(self, item: _Item, order: tuple[str, ...]) -> None:
        """While nothing fits yet, how many of the layers the order's stages hold within memory at most."""
        if math.isfinite(self.threshold()):
            return
        held = self.planner.ordered(item, order)[0].most_layers(math.inf)
        if held >= 0:
            self.planner.infeasible.note_cover(
                held / self.planner.model.num_layers,
                (f"no feasible strategy: memory: the closest configuration (dp={item.dp}, stage order "
                 f"{' > '.join(order)}, {sum(len(g) for g in item.groups.values())} groups) holds at most "
                 f"{int(held)} of the model's {self.planner.model.num_layers} layers within memory"))

    def run_item(self, item: _Item, orders: list[tuple[str, ...]]) -> None:
        planner = self.planner
        while item.pending:
            item.pending.sort(key=lambda entry: entry[0])
            entry = item.pending[0]
            bound, kind, key, start, floor = entry
            if bound >= self.threshold():
                planner.bounded += len(item.pending)
                item.pending = []
                break
            self.tick()
            if kind == "every order":
                self.solve_every_order(item, orders, start, floor)
                self.orders_done += len(orders)
            elif kind == "last":  # the orders ending in type `key`: head placed, embedding still free
                order = next(o for o in orders if o[-1] == key)
                problem, _, constant = planner.ordered(item, order, "last")
                floor = max(floor, self.floor(problem) + constant)
                least, tighter = self.bound(problem, start, floor)
                if math.isfinite(tighter):
                    item.pending += [(max(bound, tighter), "order", o, least, floor) for o in orders if o[-1] == key]
                else:
                    planner.bounded += 1
                    self.note_cover(item, order)
            elif kind == "order":  # the order's least M exactly (memory at every position), its sum relaxed
                relaxed, _, constant = planner.ordered(item, key, "order")
                floor = max(floor, self.floor(relaxed) + constant)
                least, tighter = self.bound(planner.ordered(item, key)[0], start, floor)
                if math.isfinite(tighter) and math.isfinite(self.threshold()):
                    # a plan that can still win has M <= threshold - alpha * floor, so its sum is at least
                    # the relaxed sum there (the sum only falls as M grows)
                    highest = (self.threshold() - relaxed.alpha * floor) * (1 + 1e-12)
                    if highest >= least:
                        self.tick()
                        floor = max(floor, relaxed.least_sum(highest) + constant)
                        tighter = least + relaxed.alpha * floor
                if math.isfinite(tighter):
                    item.pending.append((max(bound, tighter), "exact", key, least, floor))
                else:
                    planner.bounded += 1
                    self.note_cover(item, key)
            else:
                self.solve_exact(item, key, start, floor)
                self.orders_done += 1
            item.pending.remove(entry)  # only now: a search stopped by its time limit keeps this bound

    def solve_exact(self, item: _Item, order: tuple[str, ...], start: float, floor: float) -> None:
        problem, groups, _ = self.planner.ordered(item, order)
        relaxed, _, constant = self.planner.ordered(item, order, "order")
        value, bound, total = self.solve(problem, relaxed.least_sum, start=start, floor_sum=floor)
        if bound is None or value >= self.threshold():
            return
        placed = problem.plan(bound, _above(total))
        self.offer(self._plan(item, groups, placed))

    def solve_every_order(self, item: _Item, orders: list[tuple[str, ...]], start: float, floor: float) -> None:
        """The best plan of the item over every order (orders_dp), ranges of M bounded by the order-free
        relaxation of bound_item (its floor too: the every-order sum with no bound on M costs the most of
        any sweep, as every state is reachable, and tightened the floor too little to pay for itself);
        the plan rebuilt on the order that attains it."""
        problem = self.planner.all_orders(item)
        relaxed, _, constant = self.planner.ordered(item, orders[0], "item")

        def offer(bound: float, total: float) -> None:
            """The plan of sum `total` under M: its order and choices traced in tables where only what can end
            below a cap just above it is kept (the same trace: every state that reproduces it is kept)."""
            exact, groups, _ = self.planner.ordered(item, problem.best_order(bound, _above(total)))
            self.offer(self._plan(item, groups, exact.plan(bound, _above(total))))

        def relaxed_sum(bound: float, cap: float) -> float:
            return relaxed.least_sum(bound, cap - constant) + constant

        # under a time limit every better plan is kept at once, so that a stop mid-item still has it
        value, bound, total = self.solve(problem, relaxed_sum, start=start, floor_sum=floor,
                                         on_better=offer if self.time_limit_s is not None else None)
        if bound is None:
            for order in orders:
                self.note_cover(item, order)
        if bound is None or value >= self.threshold() or self.time_limit_s is not None:
            return
        offer(bound, total)

    def _plan(self, item: _Item, groups: list[Group], placed: list[layer_dp.PlacedGroup]) -> Plan:
        planner = self.planner
        plan = Plan(objective_s=0.0, dp=item.dp, micro_batches=planner.training.micro_batch_units // item.dp,
                    groups=tuple(groups), tps=tuple(p.option.tp for p in placed), recompute=tuple(
                        p.option.recompute for p in placed), stage_layers=tuple(tuple(p.stage_layers) for p in placed))
        report = evaluate_strategy(plan.to_strategy(planner.model, planner.training), planner.cluster, planner.model,
                                   planner.training, planner.profiles, cost_model=planner.cost_model)
        return dataclasses.replace(plan, objective_s=report.iteration_s)


def search(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, profiles: dict[str, Profile], *,
           cost_model: str = "full", top_k: int = 1, group_size: int | None = 128, dp: int | None = None,
           monotone_tp: bool = False, gap: float = 0.0, time_limit_s: float | None = None,
           progress: Callable[[Progress], None] | None = None) -> SearchResult:
    """The best plan of the space (module docstring). top_k: the best plans of distinct (dp, grouping,
    stage order); gap: stop proving once no plan can be more than this fraction faster; time_limit_s: CPU
    seconds, then the best plan so far with the bound proved."""
    if model.num_layers > MAX_LAYERS:
        raise UserError(f"model '{model.name}': field 'num_layers': the planner takes at most {MAX_LAYERS} layers, "
                        f"got {model.num_layers}")
    planner = Planner(cluster, model, training, profiles, cost_model=cost_model, monotone_tp=monotone_tp)
    run = _Search(planner, top_k, gap, time_limit_s, progress)
    orders = _orders(cluster)
    optimal = True
    try:
        for dp_value in batch_dp_values(cluster, training, dp):
            items = [planner.item(dp_value, grouping) for grouping in groupings(cluster, group_size)]
            if len(items) == 2 and items[0] is not None and items[1] is not None and _covers(items[1], items[0]):
                items = items[1:]  # every whole-type plan is a split plan with one tp per type
            run.items += [item for item in items if item is not None]
        run.run_items(orders)
    except _TimeUp:
        optimal = False
    if not run.top:
        if not optimal:
            raise UserError(f"--time-limit {time_limit_s:g}: no feasible plan found within the time limit")
        raise UserError(planner.infeasible.reason())
    best = run.top[0]
    unbounded = [item.lower_bound_s for item in run.items if not item.bounded]  # only the quick bound proved
    lower = min([best.objective_s / (1 + gap), run.lower_bound()] + unbounded)
    return SearchResult(best=best, top=list(run.top), evaluated=planner.evaluated, bounded=planner.bounded,
                        search_s=time.perf_counter() - run.started, search_cpu_s=time.process_time() - run.started_cpu,
                        lower_bound_s=lower, optimal=optimal and gap == 0, orders=len(orders), timed_out=not optimal)
