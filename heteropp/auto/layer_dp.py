"""The exact dynamic programme behind the search: for one data-parallel size and one pipeline order of
chip groups, the best tp / recompute per group and layer count per stage, under a bound M on the
cost model's max term.

The cost model (cost.py) reads T = max_i W_i + alpha * sum_i S_i, with per stage
S_i = k_i * t + e_i + 2 x_i (compute per micro-batch of its k_i layers, embedding / head e_i, the
transfer x_i to the next stage) and W_i = (b - alpha) * S_i + k_i * u + v_i (u: update per layer,
v_i: embedding / head update). For a bound M every stage may hold
    k_i <= min(memory cap at its position, floor((M - KW_i) / A)),   A = (b - alpha) t + u,
and what remains is to minimise sum_i S_i: a shortest path over groups placed from the pipeline's end,
whose state is (tp of the group in front, stages behind, layers placed). The stages behind give every
stage its micro-batches in flight, min(stages from it to the end, b), so the state is capped at b; the
front group's tp gives the boundary transfer (its lanes are min(tp_a, tp_b) * dp); a group's layers
may be any count between one per stage and the sum of its stages' allowances, at t per layer, so one
group step is a sliding-window minimum (a sparse table, numpy). T is then min over M of
M + alpha * sum(M), M ranging over the finitely many values A * k + KW a stage can take; the caller
(search.py) bounds which M it evaluates.

`feasible` is the same recursion for "can the layers fit under M at all" (most layers coverable per
(front tp, stages)), with no layer dimension. Pure Python + numpy; no torch, no search code above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

INF = float("inf")
_ROUND = 1e-12  # relative slack so a bound M equal to a stage weight admits that weight


@dataclass(frozen=True)
class StageVariantCaps:
    """Memory caps (most layers) of one option's stage by distance d from the pipeline's end (index d,
    d >= 1), for a stage that is neither end, the pipeline's first, its last, or both."""
    middle: np.ndarray
    first: np.ndarray
    last: np.ndarray
    both: np.ndarray

    def of(self, first: bool, last: bool) -> np.ndarray:
        if first and last:
            return self.both
        return self.first if first else self.last if last else self.middle


@dataclass(frozen=True)
class Option:
    """One (tp, recompute) choice of one group, with everything its stages cost."""
    tp: int
    recompute: bool
    pp: int
    compute_s: float          # t: one layer, one micro-batch
    update_s: float           # u: one layer, one step
    caps: StageVariantCaps
    first_extra_s: float      # embedding compute per micro-batch on the pipeline's first stage
    first_update_s: float
    last_extra_s: float       # head and loss compute per micro-batch on the pipeline's last stage
    last_update_s: float
    inner_send_s: float       # transfer to the next stage of the same group


@dataclass
class OrderedGroups:
    """One pipeline order at one dp: per group (in pipeline order) its options, and the transfer from a
    group's last stage to the next group's first, by the two tps."""
    micro_batches: int
    alpha: float
    layers: int
    options: list[list[Option]]
    boundary_send_s: list[dict[tuple[int, int], float]]   # g -> {(tp of g, tp of g + 1): seconds}; last g: {}
    same_type_next: list[bool]                          # g and g + 1 are one chip type (monotone tp)
    monotone_tp: bool = False
    tp_values: list[int] = field(default_factory=list)  # every tp any option uses, sorted

    def __post_init__(self) -> None:
        self.tp_values = sorted({o.tp for options in self.options for o in options})
        self.tail_cap = min(self.micro_batches, self.layers)

    @property
    def fronts(self) -> int:
        """Front-state slices: one per tp value, plus 'nothing placed yet' (the last index)."""
        return len(self.tp_values) + 1

    def front_tp(self, j: int) -> int | None:
        return None if j == len(self.tp_values) else self.tp_values[j]


# ---- one group's stages at every tail ----------------------------------------------------------------
@dataclass
class GroupStep:
    """For one option of group g and one front slice: per tail (stages already behind), the most layers
    the group's stages admit under M (hi), the fixed part of their per-micro-batch terms (ks) and whether
    every stage admits at least one layer (valid)."""
    option: Option
    option_index: int
    front: int
    hi: np.ndarray
    ks: np.ndarray
    valid: np.ndarray


def _allowance(option: Option, bound: float, fixed_weight: float, b_minus_alpha: float) -> float:
    """Most layers a stage may hold under bound M: A * k + KW <= M."""
    weight = b_minus_alpha * option.compute_s + option.update_s
    if bound == INF:
        return INF
    room = bound - fixed_weight
    if room < -abs(bound) * _ROUND:
        return -1.0
    if weight <= 0:
        return INF
    return math.floor(room / weight * (1 + _ROUND) + _ROUND)


def group_steps(problem: OrderedGroups, g: int, bound: float) -> list[GroupStep]:
    """Every (option, front) step of group g under bound M (inf: memory caps only)."""
    b_minus_alpha = problem.micro_batches - problem.alpha
    first_group = g == 0
    tails = np.arange(problem.tail_cap + 1)
    steps = []
    fronts = [len(problem.tp_values)] if g == len(problem.options) - 1 else range(len(problem.tp_values))
    for index, option in enumerate(problem.options[g]):
        pp = option.pp

        def stage_limit(first: bool, last: bool, send: float, position: int) -> tuple[np.ndarray, float]:
            """Allowance of the group's stage at `position` (1 = its last) at every tail, and its S extra."""
            extra = (option.first_extra_s if first else 0.0) + (option.last_extra_s if last else 0.0) + 2 * send
            update = (option.first_update_s if first else 0.0) + (option.last_update_s if last else 0.0)
            allowance = _allowance(option, bound, b_minus_alpha * extra + update, b_minus_alpha)
            caps = option.caps.of(first, last)[tails + position]
            return np.minimum(caps, allowance), extra

        # the stages between the group's last and (when it is the pipeline's first group) its first
        inner_positions = list(range(2, pp + 1))
        special_first = first_group and pp >= 2
        if special_first:
            inner_positions = inner_positions[:-1]
        inner_hi = np.zeros(len(tails))
        inner_ks = 0.0
        inner_valid = np.ones(len(tails), dtype=bool)
        if inner_positions:
            allowance = _allowance(option, bound, b_minus_alpha * 2 * option.inner_send_s, b_minus_alpha)
            caps = option.caps.middle
            far, near = inner_positions[-1], inner_positions[0]
            # caps fall with distance (more micro-batches in flight): sum them by a running total
            running = np.cumsum(np.minimum(caps, allowance))
            inner_hi = running[tails + far] - running[tails + near - 1]
            inner_valid = np.minimum(caps[tails + far], allowance) >= 1
            inner_ks = len(inner_positions) * 2 * option.inner_send_s
        if special_first:
            first_hi, first_ks = stage_limit(True, False, option.inner_send_s, pp)
            inner_hi = inner_hi + first_hi
            inner_valid = inner_valid & (first_hi >= 1)
            inner_ks += first_ks
        for front in fronts:
            front_tp = problem.front_tp(front)
            if (front_tp is not None and problem.monotone_tp and problem.same_type_next[g]
                    and option.tp < front_tp):
                continue
            if front_tp is not None and (option.tp, front_tp) not in problem.boundary_send_s[g]:
                continue  # the next group has no option at that tp
            last_stage_first = first_group and pp == 1
            send = 0.0 if front_tp is None else problem.boundary_send_s[g][(option.tp, front_tp)]
            edge_hi, edge_ks = stage_limit(last_stage_first, front_tp is None, send, 1)
            valid = inner_valid & (edge_hi >= 1)
            hi = np.where(valid, inner_hi + edge_hi, -1.0)
            steps.append(GroupStep(option=option, option_index=index, front=front, hi=hi,
                                   ks=np.full(len(tails), inner_ks + edge_ks), valid=valid))
    return steps


# ---- the sum table -------------------------------------------------------------------------------------
def _window_min(values: np.ndarray, low: int, highs: np.ndarray) -> np.ndarray:
    """out[r, y] = min(values[r, x] for y - highs[r] <= x <= y - low); inf where the window is empty."""
    rows, width = values.shape
    pad = width
    padded = np.concatenate([np.full((rows, pad), INF), values], axis=1)
    highs = np.minimum(highs.astype(np.int64), width - 1)
    lengths = highs - low + 1
    levels = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    tables = [padded]
    for level in range(1, int(levels.max()) + 1):
        half = 1 << (level - 1)
        previous = tables[-1]
        tables.append(np.minimum(previous[:, :-half], previous[:, half:]))
    y = np.arange(width)
    out = np.full((rows, width), INF)
    for level in np.unique(levels):
        chosen = np.nonzero(levels == level)[0]
        table = tables[level][chosen]
        start = y[None, :] - highs[chosen, None] + pad
        end = y[None, :] - low + pad - (1 << level) + 1
        start = np.clip(start, 0, table.shape[1] - 1)
        end = np.clip(end, 0, table.shape[1] - 1)
        found = np.minimum(np.take_along_axis(table, start, axis=1), np.take_along_axis(table, end, axis=1))
        found[:, y < low] = INF
        out[chosen] = found
    return out


@dataclass
class SumTables:
    """The tables of one bound M, kept to rebuild the plan: tables[s] after s groups from the end."""
    bound: float
    tables: list[np.ndarray]
    steps: list[list[GroupStep]]

    def best(self) -> tuple[float, int, int]:
        """(min sum, front slice, tail) over the full table at exactly L layers."""
        final = self.tables[-1][:, :, -1]
        j, tail = np.unravel_index(int(np.argmin(final)), final.shape)
        return float(final[j, tail]), int(j), int(tail)


def sum_tables(problem: OrderedGroups, bound: float) -> SumTables:
    """min sum_i S_i for every (front, tail, layers) after each group, groups placed from the end."""
    fronts, tails, width = problem.fronts, problem.tail_cap + 1, problem.layers + 1
    table = np.full((fronts, tails, width), INF)
    table[fronts - 1, 0, 0] = 0.0
    tables, all_steps = [table], []
    positions = np.arange(width)
    for g in range(len(problem.options) - 1, -1, -1):
        steps = group_steps(problem, g, bound)
        new = np.full((fronts, tails, width), INF)
        for step in steps:
            option = step.option
            rows = np.nonzero(step.valid & np.isfinite(table[step.front]).any(axis=1))[0]
            rows = rows[step.hi[rows] >= option.pp]
            if not len(rows):
                continue
            shifted = table[step.front][rows] - option.compute_s * positions[None, :]
            placed = _window_min(shifted, option.pp, step.hi[rows])
            placed += option.compute_s * positions[None, :] + step.ks[rows, None]
            j = problem.tp_values.index(option.tp)
            destinations = np.minimum(rows + option.pp, problem.tail_cap)
            for destination in np.unique(destinations):
                merged = placed[destinations == destination].min(axis=0)
                np.minimum(new[j, destination], merged, out=new[j, destination])
        tables.append(new)
        all_steps.append(steps)
        table = new
    return SumTables(bound=bound, tables=tables, steps=all_steps)


def most_layers(problem: OrderedGroups, bound: float) -> float:
    """The most layers some choice holds under bound M within memory, with at least one layer per stage
    and at most L stages (-inf when not even one layer per stage fits)."""
    fronts, depth = problem.fronts, problem.layers + 1
    most = np.full((fronts, depth), -INF)
    most[fronts - 1, 0] = 0.0
    for g in range(len(problem.options) - 1, -1, -1):
        new = np.full((fronts, depth), -INF)
        for step in group_steps_exact_tail(problem, g, bound):
            pp = step.option.pp
            reach = most[step.front][: depth - pp] + step.hi[: depth - pp]
            reach = np.where(step.valid[: depth - pp] & (step.hi[: depth - pp] >= pp), reach, -INF)
            j = problem.tp_values.index(step.option.tp)
            np.maximum(new[j, pp:], reach, out=new[j, pp:])
        most = new
        if not np.isfinite(most).any():
            return -INF
    return float(most.max())


def feasible(problem: OrderedGroups, bound: float) -> bool:
    return most_layers(problem, bound) >= problem.layers


def group_steps_exact_tail(problem: OrderedGroups, g: int, bound: float) -> list[GroupStep]:
    """group_steps over tails 0..L (not capped at b): the feasibility recursion counts stages exactly."""
    capped = problem.tail_cap
    problem.tail_cap = problem.layers
    try:
        return group_steps(problem, g, bound)
    finally:
        problem.tail_cap = capped


def bound_candidates(problem: OrderedGroups) -> np.ndarray:
    """Every value A * k + KW a stage's weight can take (k = 1..L), sorted: the bounds worth trying."""
    b_minus_alpha = problem.micro_batches - problem.alpha
    weights, fixed = [], []
    last = len(problem.options) - 1
    for g, options in enumerate(problem.options):
        for option in options:
            sends = [option.inner_send_s] + [s for (tp, _), s in problem.boundary_send_s[g].items() if tp == option.tp]
            ends = [(2 * send, 0.0) for send in sends]
            if g == last:
                ends.append((option.last_extra_s, option.last_update_s))
            if g == 0:
                ends += [(extra + option.first_extra_s, update + option.first_update_s) for extra, update in ends]
            for extra, update in ends:
                weights.append(b_minus_alpha * option.compute_s + option.update_s)
                fixed.append(b_minus_alpha * extra + update)
    pairs = np.unique(np.array([weights, fixed]).T, axis=0)
    counts = np.arange(1, problem.layers + 1, dtype=float)
    values = (pairs[:, 1:2] + pairs[:, 0:1] * counts[None, :]).ravel()
    return np.unique(values)


# ---- rebuilding the plan ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlacedGroup:
    option: Option
    stage_layers: list[int]   # in pipeline order


def rebuild(problem: OrderedGroups, solved: SumTables) -> list[PlacedGroup]:
    """The choices behind SumTables.best(), group by group from the pipeline's front."""
    value, front, tail = solved.best()
    layers = problem.layers
    placed: list[PlacedGroup] = []
    count = len(problem.options)
    for s in range(count - 1, -1, -1):       # table s + 1 came from placing group g = count - 1 - s
        g = count - 1 - s
        previous = solved.tables[s]
        found = _find_source(problem, solved.steps[s], previous, front, tail, layers, value)
        if found is None:
            raise AssertionError("dynamic programme: no source state reproduces the optimum")
        step, source_tail, group_layers, source_value = found
        allowances = _stage_allowances(problem, g, step, source_tail, solved.bound)
        placed.append(PlacedGroup(option=step.option, stage_layers=_spread(group_layers, allowances)))
        front, tail, layers, value = step.front, source_tail, layers - group_layers, source_value
    return placed


def _find_source(problem, steps, previous, front, tail, layers, value):
    tolerance = 1e-9 * max(1.0, abs(value))
    target_tp = problem.front_tp(front)
    for step in steps:
        option = step.option
        if option.tp != target_tp:
            continue
        for source_tail in range(problem.tail_cap + 1):
            if min(source_tail + option.pp, problem.tail_cap) != tail or not step.valid[source_tail]:
                continue
            high = int(min(step.hi[source_tail], layers))
            for group_layers in range(option.pp, high + 1):
                before = previous[step.front, source_tail, layers - group_layers]
                if abs(before + option.compute_s * group_layers + step.ks[source_tail] - value) <= tolerance:
                    return step, source_tail, group_layers, float(before)
    return None


def _stage_allowances(problem: OrderedGroups, g: int, step: GroupStep, tail: int, bound: float) -> list[int]:
    """Each stage's allowance (pipeline order within the group) at this tail."""
    option, b_minus_alpha = step.option, problem.micro_batches - problem.alpha
    front_tp = problem.front_tp(step.front)
    result = []
    for position in range(option.pp, 0, -1):
        first = g == 0 and position == option.pp
        last = position == 1 and front_tp is None
        send = (0.0 if last else problem.boundary_send_s[g][(option.tp, front_tp)] if position == 1
                else option.inner_send_s)
        extra = (option.first_extra_s if first else 0.0) + (option.last_extra_s if last else 0.0) + 2 * send
        update = (option.first_update_s if first else 0.0) + (option.last_update_s if last else 0.0)
        allowance = _allowance(option, bound, b_minus_alpha * extra + update, b_minus_alpha)
        result.append(int(min(option.caps.of(first, last)[tail + position], allowance)))
    return result


def _spread(total: int, allowances: list[int]) -> list[int]:
    """`total` layers over stages as evenly as their allowances let (extras on later stages)."""
    counts = [1] * len(allowances)
    remaining = total - len(allowances)
    while remaining > 0:
        open_stages = [i for i, (c, a) in enumerate(zip(counts, allowances)) if c < a]
        level = min(counts[i] for i in open_stages)
        for i in reversed([i for i in open_stages if counts[i] == level]):
            if remaining == 0:
                break
            counts[i] += 1
            remaining -= 1
    return counts
