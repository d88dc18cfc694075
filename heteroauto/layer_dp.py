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
(front tp, stages)), with no layer dimension. What the search asks (OrderedGroups.least_sum, most_layers,
feasible, plan) is one call each into the C++ extension heteroauto._dp, on the problem flattened once
(native(): each group's shape, made in C++ from its options as _shape makes it, once per group key); the
numpy functions here (sum_tables, most_layers, rebuild, group_steps, ...) are the reference the tests
compare it against. No torch, no search code above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from heteroauto import _dp

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

    def fewest(self) -> float:
        """The fewest layers a stage of this option holds at any position (caps fall with distance; a
        single stage is both the first and the last, holding the embedding and the head)."""
        return float(min(caps[-1] for caps in (self.middle, self.first, self.last, self.both)))


@dataclass(frozen=True)
class Option:
    """One (tp, recompute) choice of one group, with everything its stages cost."""
    tp: int
    recompute: bool
    pp: int
    compute_s: float  # t: one layer, one micro-batch
    update_s: float  # u: one layer, one step
    caps: StageVariantCaps
    first_extra_s: float  # embedding compute per micro-batch on the pipeline's first stage
    first_update_s: float
    last_extra_s: float  # head and loss compute per micro-batch on the pipeline's last stage
    last_update_s: float
    inner_send_s: float  # transfer to the next stage of the same group


@dataclass
class OrderedGroups:
    """One pipeline order at one dp: per group (in pipeline order) its options, and the transfer from a
    group's last stage to the next group's first, by the two tps."""
    micro_batches: int
    alpha: float
    layers: int
    options: list[list[Option]]
    boundary_send_s: list[dict[tuple[int, int], float]]  # g -> {(tp of g, tp of g + 1): seconds}; last g: {}
    same_type_next: list[bool]  # g and g + 1 are one chip type (monotone tp)
    monotone_tp: bool = False
    relaxed: bool = False  # memory caps by the stage's position in its group only (a lower bound)
    tp_values: list[int] = field(default_factory=list)  # every tp any option uses, sorted (given: shared slices)
    starts_pipeline: bool = True  # group 0 is the pipeline's first (False: a chain inside a longer pipeline)
    follower: bool = False  # the last group is the next chain's first: it gives the transfer, is not placed
    # group steps by what makes them (group_key) and tail cap: (bound, steps) of the last bound asked, and
    # the bound-free shapes; problems built from the same option lists may share one (their groups alike)
    shared: dict = field(default_factory=dict, repr=False)
    most_stages: int | None = None  # most stages any pipeline of the space has (default: these groups' most

    # when they are a whole pipeline, else the layers)

    def __post_init__(self) -> None:
        self.tp_values = self.tp_values or sorted({o.tp for options in self.options for o in options})
        # stages behind matter only through micro-batches in flight (relaxed: not at all), and never exceed
        # the pipeline's stages: a cap at or above that count truncates nothing
        most_stages = self.most_stages
        if most_stages is None:
            whole = self.starts_pipeline and not self.follower
            most_stages = sum(max((o.pp for o in options), default=0)
                              for options in self.options) if whole else self.layers
        self.stage_cap = min(self.layers, most_stages)  # stages behind any state: at most L, at most the most
        self.tail_cap = 0 if self.relaxed else min(self.micro_batches, self.stage_cap)
        self._group_keys: list | None = None
        self.candidates: np.ndarray | None = None
        self._native: _dp.Ordered | None = None

    @property
    def fronts(self) -> int:
        """Front-state slices: one per tp value, plus 'nothing placed yet' (the last index)."""
        return len(self.tp_values) + 1

    def front_tp(self, j: int) -> int | None:
        return None if j == len(self.tp_values) else self.tp_values[j]

    def group_key(self, g: int) -> tuple:
        """Everything group g's steps depend on besides the bound and the tail cap: two problems (two stage
        orders, two chains) whose groups have equal keys share the steps. The options enter by identity:
        the problems sharing a cache hold the lists (the caller keeps them alive as long as the cache)."""
        if self._group_keys is None:
            last = len(self.options) - 1
            self._group_keys = [(id(options), g == 0 and self.starts_pipeline, g == last, tuple(self.tp_values),
                                 tuple(sorted(self.boundary_send_s[g].items())), self.monotone_tp
                                 and self.same_type_next[g], self.relaxed, self.micro_batches, self.alpha)
                                for g, options in enumerate(self.options)]
        return self._group_keys[g]

    # what the search asks of a problem (orders_dp.AllOrders answers the same for every order at once): one
    # C++ call each (_dp), on the problem flattened once; sum_tables and most_layers below are the numpy
    # reference they are tested against (and what rebuild traces the plan in)
    def least_sum(self, bound: float, cap: float = INF) -> float:
        """The least sum under bound M; a value >= cap means only 'not below cap' (see place_sums)."""
        return self.native().least_sum(bound, cap)

    def most_layers(self, bound: float) -> float:
        """As most_layers(self, bound)."""
        return self.native().most_layers(bound)

    def feasible(self, bound: float) -> bool:
        return self.most_layers(bound) >= self.layers

    def plan(self, bound: float, cap: float = INF) -> list[PlacedGroup]:
        """The choices of the least sum under M (below cap), group by group from the pipeline's front: traced
        in the C++ tables as rebuild traces the numpy ones."""
        placed = []
        shapes = native_registry(self)[0]
        for g, (pair, tail, layers) in enumerate(self.native().trace(bound, cap)):
            option_index, front = shapes.pairs(native_shape(self, g, self.stage_cap))[:2]
            option = self.options[g][int(option_index[pair])]
            allowances = _stage_allowances(self, g, option, int(front[pair]), tail, bound)
            placed.append(PlacedGroup(option=option, stage_layers=_spread(layers, allowances)))
        return placed

    def native(self) -> _dp.Ordered:
        """The problem in C++: its groups' shapes from the end, at the most layers' tail cap (the sums read the
        first tail_cap + 1 tails of each: the same steps)."""
        if self._native is None:
            least_rate = min(o.compute_s for options in self.options for o in options)
            self._native = _dp.Ordered(
                shapes=native_registry(self)[0], groups=[
                    native_shape(self, g, self.stage_cap) for g in range(len(self.options) - 1, -1, -1)
                ], fronts=self.fronts, tail_cap=self.tail_cap, stage_cap=self.stage_cap, layers=self.layers,
                least_rate=least_rate)
        return self._native

    def bound_values(self) -> np.ndarray:
        return bound_candidates(self)


# ---- one group's stages at every tail ----------------------------------------------------------------
@dataclass
class GroupSteps:
    """Every way to place group g under bound M: per pair (option, front slice) and per tail (stages
    already behind), the most layers its stages admit (hi), whether each stage admits one (valid), and
    the fixed part of their per-micro-batch terms (ks, per pair)."""
    options: list[Option]
    option_index: np.ndarray  # per pair
    front: np.ndarray  # per pair: the slice it reads
    destination: np.ndarray  # per pair: the slice it writes (its tp)
    pp: np.ndarray
    compute_s: np.ndarray
    ks: np.ndarray
    hi: np.ndarray  # (pairs, tails)
    valid: np.ndarray  # (pairs, tails)


def _allowance(option: Option, bound: float, fixed_weight: float, b_minus_alpha: float) -> float:
    """Most layers a stage may hold under bound M: A * k + KW <= M."""
    if bound == INF:
        return INF
    weight = b_minus_alpha * option.compute_s + option.update_s
    room = bound - fixed_weight
    if room < -abs(bound) * _ROUND:
        return -1.0
    if weight <= 0:
        return INF
    return math.floor(room / weight * (1 + _ROUND) + _ROUND)


def _ends(option: Option, first: bool, last: bool, send: float) -> tuple[float, float]:
    """(S extra, update extra) of a stage: embedding if first, head if last, twice its send."""
    extra = (option.first_extra_s if first else 0.0) + (option.last_extra_s if last else 0.0) + 2 * send
    update = (option.first_update_s if first else 0.0) + (option.last_update_s if last else 0.0)
    return extra, update


def _allowances(bound: float, fixed_weight: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """_allowance over arrays of stage variants."""
    if bound == INF:
        return np.full(len(weight), INF)
    free = weight <= 0
    return _allowances_of(bound, fixed_weight, np.where(free, 1.0, weight), free if free.any() else None)


def _allowances_of(bound: float, fixed_weight: np.ndarray, positive_weight: np.ndarray,
                   free: np.ndarray | None) -> np.ndarray:
    """_allowances with the weights <= 0 (free: their mask, None when there is none) given as 1."""
    room = bound - fixed_weight
    count = np.floor(room / positive_weight * (1 + _ROUND) + _ROUND)
    if free is not None:
        count[free] = INF
    count[room < -abs(bound) * _ROUND] = -1.0
    return count


@dataclass
class _GroupShape:
    """What group g's steps are made of, independent of the bound M: per option its inner stages (their
    caps by distance, the stage range, their fixed weight), its first stage when g is the pipeline's first,
    and per (option, front) pair the group's last stage."""
    steps: GroupSteps  # hi and valid left empty
    weight: np.ndarray  # A per option
    inner_caps: np.ndarray  # (options, depth)
    inner_far: np.ndarray  # per option: distance offset of the farthest inner stage (0: none)
    inner_near: np.ndarray
    inner_fixed: np.ndarray  # KW of an inner stage, per option
    first_caps: np.ndarray | None  # (options, tails) or None
    first_fixed: np.ndarray | None
    pair_weight: np.ndarray
    edge_caps: np.ndarray  # (pairs, tails)
    edge_fixed: np.ndarray  # per pair
    # the allowances of the inner, first and edge stages in one call (weights <= 0 as 1, their mask or None)
    every_fixed: np.ndarray = field(default_factory=lambda: np.zeros(0))
    every_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    every_free: np.ndarray | None = None
    far: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (options, tails): flat index
    near: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # of the running total
    has_inner: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # (options, 1)
    special: np.ndarray | None = None  # (options, 1): a first stage of its own

    def __post_init__(self) -> None:
        fixed = [self.inner_fixed] + ([self.first_fixed] if self.first_caps is not None else []) + [self.edge_fixed]
        weight = [self.weight] + ([self.weight] if self.first_caps is not None else []) + [self.pair_weight]
        self.every_fixed, every_weight = np.concatenate(fixed), np.concatenate(weight)
        free = every_weight <= 0
        self.every_weight, self.every_free = np.where(free, 1.0, every_weight), free if free.any() else None


def _shape(problem: OrderedGroups, g: int, tail_cap: int) -> _GroupShape:
    b_minus_alpha = problem.micro_batches - problem.alpha
    first_group = g == 0 and problem.starts_pipeline
    tails = np.zeros(tail_cap + 1, dtype=np.int64) if problem.relaxed else np.arange(tail_cap + 1)
    options = problem.options[g]
    last_slice = len(problem.tp_values)
    fronts = [last_slice] if g == len(problem.options) - 1 else range(last_slice)
    weight = np.array([b_minus_alpha * o.compute_s + o.update_s for o in options])
    far, near, inner_fixed, inner_ks = [], [], [], []
    first_caps, first_fixed, first_ks = [], [], []
    for option in options:
        positions = list(range(2, option.pp + 1))
        if first_group and option.pp >= 2:
            positions = positions[:-1]
            extra, update = _ends(option, True, False, option.inner_send_s)
            first_caps.append(option.caps.first[tails + option.pp])
            first_fixed.append(b_minus_alpha * extra + update)
            first_ks.append(extra)
        else:
            first_caps.append(np.full(len(tails), INF))
            first_fixed.append(-INF)
            first_ks.append(0.0)
        far.append(positions[-1] if positions else 0)
        near.append(positions[0] if positions else 1)
        inner_fixed.append(b_minus_alpha * 2 * option.inner_send_s)
        inner_ks.append(len(positions) * 2 * option.inner_send_s)
    pairs, edge_caps, edge_fixed, kss = [], [], [], []
    for index, option in enumerate(options):
        edge_first = first_group and option.pp == 1
        for front in fronts:
            front_tp = problem.front_tp(front)
            if front_tp is not None:
                if problem.monotone_tp and problem.same_type_next[g] and option.tp < front_tp:
                    continue
                if (option.tp, front_tp) not in problem.boundary_send_s[g]:
                    continue  # the next group has no option at that tp
            send = 0.0 if front_tp is None else problem.boundary_send_s[g][(option.tp, front_tp)]
            extra, update = _ends(option, edge_first, front_tp is None, send)
            pairs.append((index, front, problem.tp_values.index(option.tp), option.pp, option.compute_s))
            edge_caps.append(option.caps.of(edge_first, front_tp is None)[tails + 1])
            edge_fixed.append(b_minus_alpha * extra + update)
            kss.append(inner_ks[index] + first_ks[index] + extra)
    columns = list(zip(*pairs)) if pairs else [[]] * 5
    index = np.array(columns[0], dtype=np.int64)
    steps = GroupSteps(options=options,
                       option_index=index, front=np.array(columns[1], dtype=np.int64), destination=np.array(
                           columns[2], dtype=np.int64), pp=np.array(columns[3], dtype=np.int64), compute_s=np.array(
                               columns[4], dtype=float), ks=np.array(kss, dtype=float), hi=np.zeros(
                                   (len(pairs), len(tails))), valid=np.zeros((len(pairs), len(tails)), dtype=bool))
    has_first = first_group and any(o.pp >= 2 for o in options)
    return _GroupShape(steps=steps, weight=weight, inner_caps=np.array([o.caps.middle
                                                                        for o in options]), inner_far=np.array(far),
                       inner_near=np.array(near), inner_fixed=np.array(inner_fixed), first_caps=np.array(first_caps)
                       if has_first else None, first_fixed=np.array(first_fixed) if has_first else None,
                       pair_weight=weight[index] if len(pairs) else np.zeros(0), edge_caps=np.array(edge_caps).reshape(
                           len(pairs), len(tails)), edge_fixed=np.array(edge_fixed))


def group_steps(problem: OrderedGroups, g: int, bound: float, tail_cap: int | None = None) -> GroupSteps:
    """Every (option, front) step of group g under bound M (inf: memory caps only), at tails
    0..tail_cap (default: the problem's, capped at b)."""
    tail_cap = problem.tail_cap if tail_cap is None else tail_cap
    key = ("steps", problem.group_key(g), tail_cap)
    known = problem.shared.get(key)
    if known is None or known[0] != bound:
        known = problem.shared[key] = (bound, _group_steps(problem, g, bound, tail_cap))
    return known[1]


def _cached_shape(problem: OrderedGroups, g: int, tail_cap: int) -> _GroupShape:
    """Group g's shape at tail_cap, made once per group key (problem.shared)."""
    key = ("shape", problem.group_key(g), tail_cap)
    shape = problem.shared.get(key)
    if shape is None:
        shape = problem.shared[key] = _shape(problem, g, tail_cap)
        tails = np.zeros(tail_cap + 1, dtype=np.int64) if problem.relaxed else np.arange(tail_cap + 1)
        # the caps past the farthest inner stage at the deepest tail are never read: the running total stops there
        shape.inner_caps = shape.inner_caps[:, :max(2, int(tails.max() + shape.inner_far.max()) + 1)]
        options, depth = shape.inner_caps.shape
        rows = np.arange(options)[:, None] * depth
        shape.far = rows + tails[None, :] + shape.inner_far[:, None]
        shape.near = rows + tails[None, :] + shape.inner_near[:, None] - 1
        shape.has_inner = (shape.inner_far > 0)[:, None]
        shape.special = None if shape.first_caps is None else np.isfinite(shape.first_fixed)[:, None]
    return shape


def native_registry(problem: OrderedGroups) -> tuple[_dp.Shapes, dict]:
    """The C++ registry of shapes the problems sharing problem.shared share, and its ids by (group key, tail cap)."""
    return problem.shared.setdefault("native", (_dp.Shapes(), {}))


def native_shape(problem: OrderedGroups, g: int, tail_cap: int, registry: tuple[_dp.Shapes, dict] | None = None) -> int:
    """Id of group g's shape at tail_cap in a C++ registry (default: the problem's, native_registry), made once
    per group key from the group's options (_dp builds it as _shape does, and its steps under a bound as
    _group_steps)."""
    shapes, ids = registry or native_registry(problem)
    key = (problem.group_key(g), tail_cap)
    if key not in ids:
        options = problem.options[g]
        if ("options", id(options)) not in ids:
            ids[("options", id(options))] = _native_options(shapes, options)
        last_group = g == len(problem.options) - 1
        sends = problem.boundary_send_s[g]
        ids[key] = shapes.make(
            options=ids[("options", id(options))], tp_values=problem.tp_values,
            sends=np.array([[sends.get((o.tp, tp), math.nan) for tp in problem.tp_values]
                            for o in options]) if not last_group else np.zeros(
                                (len(options), len(problem.tp_values))), first_group=g == 0 and problem.starts_pipeline,
            last_group=last_group, monotone_next=problem.monotone_tp and problem.same_type_next[g],
            relaxed=problem.relaxed, b_minus_alpha=float(problem.micro_batches - problem.alpha), tail_cap=tail_cap)
    return ids[key]


def _native_options(shapes: _dp.Shapes, options: list[Option]) -> int:

    def column(name: str) -> np.ndarray:
        return np.array([getattr(o, name) for o in options], dtype=float)

    def caps(kind: str) -> np.ndarray:
        return np.array([getattr(o.caps, kind) for o in options], dtype=float).reshape(len(options), -1)

    return shapes.options(tp=np.array([o.tp for o in options], dtype=np.int64), pp=np.array(
        [o.pp for o in options],
        dtype=np.int64), compute=column("compute_s"), update=column("update_s"), first_extra=column("first_extra_s"),
                          first_update=column("first_update_s"), last_extra=column("last_extra_s"),
                          last_update=column("last_update_s"), inner_send=column("inner_send_s"), middle=caps("middle"),
                          first=caps("first"), last=caps("last"), both=caps("both"))


def _group_steps(problem: OrderedGroups, g: int, bound: float, tail_cap: int) -> GroupSteps:
    shape = _cached_shape(problem, g, tail_cap)
    steps = shape.steps
    if not len(steps.pp):
        return steps
    options = len(shape.weight)
    if bound == INF:
        every = np.full(len(shape.every_fixed), INF)
    else:
        every = _allowances_of(bound, shape.every_fixed, shape.every_weight, shape.every_free)
    # inner stages: caps fall with distance (more micro-batches in flight); sum them by a running total
    limited = np.minimum(shape.inner_caps, every[:options, None])
    running = np.zeros(limited.shape)  # from distance 1 (index 0 is never read)
    np.cumsum(limited[:, 1:], axis=1, out=running[:, 1:])
    running = running.ravel()
    inner_hi = np.where(shape.has_inner, running[shape.far] - running[shape.near], 0.0)
    inner_valid = ~shape.has_inner | (limited.ravel()[shape.far] >= 1)
    if shape.special is not None:
        first_hi = np.minimum(shape.first_caps, every[options:2 * options, None])
        inner_hi = inner_hi + np.where(shape.special, first_hi, 0.0)
        inner_valid = inner_valid & (~shape.special | (first_hi >= 1))
    edge_hi = np.minimum(shape.edge_caps, every[len(every) - len(shape.edge_fixed):, None])
    hi = inner_hi[steps.option_index] + edge_hi
    valid = inner_valid[steps.option_index] & (edge_hi >= 1) & (hi >= steps.pp[:, None])
    return GroupSteps(options=steps.options, option_index=steps.option_index, front=steps.front,
                      destination=steps.destination, pp=steps.pp, compute_s=steps.compute_s, ks=steps.ks, hi=hi,
                      valid=valid)


# ---- the sum table -------------------------------------------------------------------------------------
_STACKED_CELLS = 1 << 19  # _window_min builds every level for every row while that many cells or fewer


def _window_min(values: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """out[r, y] = min(values[r, x] for y - highs[r] <= x <= y - lows[r]); inf where the window is empty.
    The few-rows tables of the search: every level for every row in one stack (_window_min_stacked, a
    handful of numpy calls); larger ones level by level for only the rows that need it (_window_min_sorted).
    Both take minima of the same values: equal entry for entry."""
    rows, width = values.shape
    highs = np.minimum(highs.astype(np.int64), width - 1)
    lows = lows.astype(np.int64)
    small = (width.bit_length() + 1) * rows * 2 * width <= _STACKED_CELLS
    if small and rows and int(highs.max()) >= 0 and int(lows.min()) >= 0:
        return _window_min_stacked(values, lows, highs)
    return _window_min_sorted(values, lows, highs)


def _window_min_stacked(values: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """_window_min with the levels of a sparse table (level l: minima of 2^l consecutive values) built for
    every row at once, rows padded on the left by the widest window; each window the minimum of two
    overlapping blocks of its level, gathered for every (row, y) at once. highs already clipped."""
    rows, width = values.shape
    some = lows <= highs
    lengths = np.where(some, highs - lows + 1, 1)
    levels = np.floor(np.log2(lengths)).astype(np.int64)
    pad = int(highs.max())
    table = np.full((int(levels.max()) + 1, rows, pad + width), INF)
    table[0, :, pad:] = values
    for level in range(1, len(table)):
        half = 1 << (level - 1)
        np.minimum(table[level - 1, :, :-half], table[level - 1, :, half:], out=table[level, :, :-half])
    y = np.arange(width)[None, :]
    start = pad + y - highs[:, None]
    second = pad + y - lows[:, None] - (1 << levels)[:, None] + 1
    row, level = np.arange(rows)[:, None], levels[:, None]
    last = pad + width - 1  # the empty windows' columns, clipped: read, then set to inf
    out = np.minimum(table[level, row, np.clip(start, 0, last)], table[level, row, np.clip(second, 0, last)])
    out[~some] = INF
    return out


def _window_min_sorted(values: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """_window_min by a sparse table per row (level l: minima of 2^l consecutive values), rows sorted by the
    level their window needs so each level is built only for the rows that need it; a window is the minimum
    of two overlapping blocks, read as whole row slices. Rows are padded on the left by the widest window, so a
    window reaching below x = 0 reads inf there. highs already clipped to the row."""
    rows, width = values.shape
    result = np.full((rows, width), INF)
    some = lows <= highs  # windows that fall inside the row at all
    if not some.all():
        values, lows, highs = values[some], lows[some], highs[some]
    if not len(values):
        return result
    levels = np.floor(np.log2(highs - lows + 1)).astype(np.int64)
    order = np.argsort(-levels, kind="stable")
    levels, highs, lows = levels[order], highs[order], lows[order]
    pad = int(highs.max())
    table = np.concatenate([np.full((len(values), pad), INF), values[order]], axis=1)  # x at column pad + x
    out = np.empty((len(values), width))
    for level in range(int(levels[0]) + 1):
        start = int(np.searchsorted(-levels, -level, side="left"))
        stop = int(np.searchsorted(-levels, -level, side="right"))
        if level:  # level l from level l - 1, only for the rows whose windows need it
            half = 1 << (level - 1)
            table = np.minimum(table[:stop, :-half], table[:stop, half:])
        if start == stop:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(table[start:stop], width, axis=1)
        picked = np.arange(stop - start)
        out[start:stop] = np.minimum(windows[picked, pad - highs[start:stop]],
                                     windows[picked, pad - lows[start:stop] - (1 << level) + 1])
    placed = np.empty_like(out)
    placed[order] = out
    if some.all():
        return placed
    result[some] = placed
    return result


def _reduce_rows(target: np.ndarray, destinations: np.ndarray, values: np.ndarray, op) -> None:
    """target[d] = op(target[d], op-reduction of values[destinations == d]) for every row index d."""
    order = np.argsort(destinations, kind="stable")
    destinations, values = destinations[order], values[order]
    starts = np.flatnonzero(np.r_[True, destinations[1:] != destinations[:-1]])
    reduced = op.reduceat(values, starts, axis=0)
    target[destinations[starts]] = op(target[destinations[starts]], reduced)


@dataclass
class SumTables:
    """The tables of one bound M, kept to rebuild the plan: tables[s] after s groups from the end."""
    bound: float
    tables: list[np.ndarray]
    steps: list[GroupSteps]

    def best(self) -> tuple[float, int, int]:
        """(min sum, front slice, tail) over the full table at exactly L layers."""
        final = self.tables[-1][:, :, -1]
        j, tail = np.unravel_index(int(np.argmin(final)), final.shape)
        return float(final[j, tail]), int(j), int(tail)


def sum_tables(problem: OrderedGroups, bound: float, cap: float = INF, least_rate: float = 0.0) -> SumTables:
    """min sum_i S_i for every (front, tail, layers) after each group, groups placed from the end."""
    table = np.full((problem.fronts, problem.tail_cap + 1, problem.layers + 1), INF)
    table[problem.fronts - 1, 0, 0] = 0.0
    tables, all_steps = place_sums(problem, table, bound, range(len(problem.options) - 1, -1, -1), cap, least_rate)
    while len(tables) < len(problem.options) + 1:
        tables.append(np.full_like(table, INF))
    return SumTables(bound=bound, tables=tables, steps=all_steps)


def place_sums(problem: OrderedGroups, table: np.ndarray, bound: float, groups: range, cap: float = INF,
               least_rate: float = 0.0, copies: int = 1,
               rest: Callable[[int], np.ndarray] | None = None) -> tuple[list[np.ndarray], list[GroupSteps]]:
    """Place `groups` (from the end) onto a sum table: the table after each, and their steps (stops early
    once nothing is reachable). With a cap, states that cannot end below it (their sum plus the layers
    still to place at least_rate, the least time of a layer anywhere) are cleared: the least sum is then
    exact when below the cap and only known to be >= cap otherwise. copies: that many tables stacked along
    the front axis, placed at once (one set of numpy calls for all). rest(i), when given: per copy and
    layers placed, a lower bound on what the groups still to place after groups[i] add (instead of the
    layers left at least_rate)."""
    layers_left = (problem.layers - np.arange(problem.layers + 1)) * least_rate
    fronts, tails, width = problem.fronts * copies, problem.tail_cap + 1, problem.layers + 1
    tables, all_steps = [table], []
    positions = np.arange(width, dtype=float)
    shift = (np.arange(copies) * problem.fronts)[:, None]
    live = np.isfinite(table).any(axis=2)  # (fronts, tails): any layer count
    for step, g in enumerate(groups):
        steps = group_steps(problem, g, bound)
        new = np.full((fronts, tails, width), INF)
        front = (steps.front[None, :] + shift).ravel()  # per (copy, pair)
        copy_pair, tail = np.nonzero(np.tile(steps.valid, (copies, 1)) & live[front])
        live = np.zeros((fronts, tails), dtype=bool)
        if len(copy_pair):
            placed, destination, start = _place_rows(problem, steps, table, front, copy_pair, tail, positions)
            if cap < INF:
                columns = slice(start, start + placed.shape[1])
                remaining = layers_left[columns] if rest is None else rest(step)[copy_pair // len(steps.pp), columns]
                placed[placed + remaining >= cap] = INF
            reached = np.isfinite(placed).any(axis=1)
            if reached.any():
                placed, destination = placed[reached], destination[reached]
                _reduce_rows(
                    new.reshape(fronts * tails, width)[:, start:start + placed.shape[1]], destination, placed,
                    np.minimum)
                live.reshape(-1)[destination] = True
                _drop_dominated(new, INF, np.minimum, live)
        tables.append(new)
        all_steps.append(steps)
        table = new
        if not live.any():
            break
    return tables, all_steps


@dataclass
class Rows:
    """A sum table of shape (fronts, tails, layers + 1) by its rows that may hold a finite entry: rows[i] =
    front * tails + tail (ascending), values[i] that row. orders_dp's tables are nearly all inf (about one
    row in a hundred reachable), so they are kept this way."""
    rows: np.ndarray
    values: np.ndarray

    def dense(self, fronts: int, tails: int) -> np.ndarray:
        table = np.full((fronts * tails, self.values.shape[1]), INF)
        table[self.rows] = self.values
        return table.reshape(fronts, tails, -1)

    def least_last(self) -> float:
        """The least entry at the last layer count (inf: none)."""
        return float(self.values[:, -1].min()) if len(self.rows) else INF

    def reachable(self) -> bool:
        return bool(len(self.rows)) and bool(np.isfinite(self.values).any())

    @staticmethod
    def merged(tables: list[Rows]) -> Rows:
        """Entry-wise minimum of tables."""
        if len(tables) == 1:
            return tables[0]
        return _rows_by_id(np.concatenate([t.rows for t in tables]), np.concatenate([t.values
                                                                                     for t in tables]), np.minimum)


def _rows_by_id(ids: np.ndarray, values: np.ndarray, op) -> Rows:
    """Rows holding op-reduction of the values of equal ids, ids ascending."""
    order = np.argsort(ids, kind="stable")
    ids, values = ids[order], values[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, dtype=np.int64)
    if len(starts) == len(ids):
        return Rows(rows=ids, values=values)
    return Rows(rows=ids[starts], values=op.reduceat(values, starts, axis=0))


def place_sums_rows(jobs: list[tuple[OrderedGroups, int, list[Rows], np.ndarray | None]], bound: float,
                    cap: float = INF, least_rate: float = 0.0) -> list[list[Rows]]:
    """One group placed onto each of several Rows tables in one set of numpy calls: jobs[i] = (problem, g,
    its tables, per table and layers placed a lower bound on what the groups still to place add, or None:
    the layers left at least_rate), every problem with the same fronts, tails and layers (the chains of one
    orders_dp.AllOrders). Per job, its tables after group g: as place_sums of that one group, entry for
    entry (the rows left all inf dropped)."""
    first = jobs[0][0]
    fronts, tails, width = first.fronts, first.tail_cap + 1, first.layers + 1
    size = fronts * tails  # ids of one table's rows
    columns: dict[str, list] = {name: [] for name in ("tail", "low", "high", "rate", "ks", "to", "rest")}
    sources: list[np.ndarray] = []
    rests: list[np.ndarray] = []  # per job with a rest, its per-table rows; columns["rest"] indexes them all
    least_left = ((first.layers - np.arange(width)) * least_rate).min()
    base = rest_base = 0
    for problem, g, tables, rest in jobs:
        steps, count = group_steps(problem, g, bound), len(tables)
        rows = np.concatenate([table.rows for table in tables])
        if len(steps.pp) and len(rows):
            copy = np.repeat(np.arange(count), [len(table.rows) for table in tables])
            values = np.concatenate([table.values for table in tables])
            front, tail = rows // tails, rows % tails
            pair, row = np.nonzero((steps.front[:, None] == front[None, :]) & steps.valid[:, tail])
            # rows a trim left all inf lead nowhere, nor, under a cap, rows whose every entry placed reaches
            # it (their least entry, the group's least cost and the least the rest adds; room for rounding)
            least = values.min(axis=1)[row]
            if cap < INF:
                least = least + steps.compute_s[pair] * steps.pp[pair] + steps.ks[pair] + (
                    least_left if rest is None else rest.min(axis=1)[copy[row]])
                keep = least < cap * (1 + 1e-9) + 1e-12
            else:
                keep = least < INF
            pair, row = pair[keep], row[keep]
            tail = tail[row]
            sources.append(values[row])
            columns["tail"].append(tail)
            columns["low"].append(steps.pp[pair])
            columns["high"].append(steps.hi[pair, tail])
            columns["rate"].append(steps.compute_s[pair])
            columns["ks"].append(steps.ks[pair])
            columns["to"].append((base + copy[row]) * size + steps.destination[pair] * tails +
                                 np.minimum(tail + steps.pp[pair], first.tail_cap))
            if rest is not None:
                columns["rest"].append(rest_base + copy[row])
                rests.append(rest)
                rest_base += count
        base += count
    empty = Rows(rows=np.zeros(0, dtype=np.int64), values=np.zeros((0, width)))
    result = [[empty] * len(tables) for _, _, tables, _ in jobs]
    if not sources or not sum(len(v) for v in sources):
        return result
    joined = {name: np.concatenate(values) for name, values in columns.items() if values}
    source = np.concatenate(sources)
    used = np.flatnonzero(np.isfinite(source).any(axis=0))
    if not len(used):
        return result
    start = int(used[0])
    stop = int(min(width, used[-1] + min(joined["high"].max(), width - 1) + 1))
    positions = np.arange(start, stop, dtype=float)
    rate = joined["rate"][:, None]
    placed = _window_min(source[:, start:stop] - rate * positions[None, :], joined["low"], joined["high"])
    placed += rate * positions[None, :] + joined["ks"][:, None]
    if cap < INF:
        remaining = (np.concatenate(rests)[joined["rest"], start:stop] if "rest" in joined else
                     ((first.layers - np.arange(width)) * least_rate)[start:stop])
        placed[placed + remaining >= cap] = INF
    reached = np.isfinite(placed).any(axis=1)
    if not reached.any():
        return result
    reduced = _rows_by_id(joined["to"][reached], placed[reached], np.minimum)
    values = np.full((len(reduced.rows), width), INF)
    values[:, start:stop] = _undominated(reduced.rows // tails, reduced.values)
    keep = np.isfinite(values[:, start:stop]).any(axis=1)
    ids, values = reduced.rows[keep], values[keep]
    bounds = np.searchsorted(ids, np.arange(base + 1) * size)
    copy = 0
    for job, (_, _, tables, _) in enumerate(jobs):
        for i in range(len(tables)):
            lo, hi = bounds[copy], bounds[copy + 1]
            if hi > lo:
                result[job][i] = Rows(rows=ids[lo:hi] - copy * size, values=values[lo:hi])
            copy += 1
    return result


def _undominated(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """_drop_dominated on rows sorted by (group = table and front, tail): an entry that one with fewer
    stages behind in its group matches or beats is cleared."""
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    if len(starts) == len(groups):
        return values
    counts = np.diff(np.r_[starts, len(groups)])
    which = np.repeat(np.arange(len(starts)), counts)
    rank = np.arange(len(groups)) - starts[which]
    padded = np.full((len(starts), int(counts.max()), values.shape[1]), INF)
    padded[which, rank] = values
    prior = np.concatenate(
        [np.full((len(starts), 1, values.shape[1]), INF),
         np.minimum.accumulate(padded, axis=1)[:, :-1]], axis=1)[which, rank]
    kept = values.copy()
    kept[np.minimum(prior, kept) == prior] = INF
    return kept


def _place_rows(problem: OrderedGroups, steps: GroupSteps, table: np.ndarray, front: np.ndarray, copy_pair: np.ndarray,
                tail: np.ndarray, positions: np.ndarray):
    """Each (copy, pair, tail) row of a group's placement: (its sums at layer columns start.., its
    destination row in the (fronts, tails) flattening, start). Only the columns some source reaches and
    those the group can carry them to are computed."""
    pair = copy_pair % len(steps.pp)
    lows, highs = steps.pp[pair], steps.hi[pair, tail]
    sources = table[front[copy_pair], tail]
    used = np.flatnonzero(np.isfinite(sources).any(axis=0))
    width = table.shape[2]
    start = int(used[0])
    stop = int(min(width, used[-1] + min(highs.max(), width - 1) + 1))
    columns = positions[start:stop]
    rate = steps.compute_s[pair][:, None]
    placed = _window_min(sources[:, start:stop] - rate * columns[None, :], lows, highs)
    placed += rate * columns[None, :] + steps.ks[pair][:, None]
    destination_front = steps.destination[pair] + copy_pair // len(steps.pp) * problem.fronts
    destination = destination_front * table.shape[1] + np.minimum(tail + steps.pp[pair], problem.tail_cap)
    return placed, destination, start


def _drop_dominated(table: np.ndarray, worst: float, better, live: np.ndarray | None = None) -> None:
    """Clear (to `worst`) every entry that an entry with fewer stages behind (axis 1; same front and, for
    sums, same layers) matches or beats: fewer stages behind means fewer micro-batches in flight, so every
    memory cap in front is at least as loose and the costs are the same; the cleared state leads nowhere
    the other does not lead at least as well. Sparser tables: fewer rows to place. live: the (front,
    stages behind) rows holding any finite entry, when known; updated for the rows left all `worst`."""
    values = table if table.ndim == 3 else table[:, :, None]
    if live is None:
        live = np.isfinite(values).any(axis=2)
    fronts = np.flatnonzero(live.sum(axis=1) > 1)
    if not len(fronts):
        return
    sub = live[fronts]
    row, tail = np.nonzero(sub)  # live tails of those fronts, by front then tail
    rank = (np.cumsum(sub, axis=1) - 1)[row, tail]  # a live tail's place among its front's
    padded = np.full((len(fronts), int(rank.max()) + 1, values.shape[2]), worst)
    padded[row, rank] = values[fronts[row], tail]
    prior = np.concatenate(
        [np.full((len(fronts), 1, values.shape[2]), worst),
         better.accumulate(padded, axis=1)[:, :-1]], axis=1)
    kept = padded[row, rank]
    kept[better(prior[row, rank], kept) == prior[row, rank]] = worst
    values[fronts[row], tail] = kept
    live[fronts[row], tail] = (kept != worst).any(axis=1)


def most_layers(problem: OrderedGroups, bound: float) -> float:
    """The most layers some choice holds under bound M within memory, with at least one layer per stage
    and at most L stages (-inf when not even one layer per stage fits)."""
    most = np.full((problem.fronts, problem.stage_cap + 1), -INF)
    most[problem.fronts - 1, 0] = 0.0
    most = place_most(problem, most, bound, range(len(problem.options) - 1, -1, -1))
    return float(most.max())


def place_most(problem: OrderedGroups, most: np.ndarray, bound: float, groups: range, copies: int = 1) -> np.ndarray:
    """Place `groups` (from the end) onto a table of most layers held per (front, stages behind); copies:
    that many tables stacked along the front axis, placed at once (as place_sums)."""
    fronts, depth = problem.fronts * copies, problem.stage_cap + 1
    shift = (np.arange(copies) * problem.fronts)[:, None]
    for g in groups:
        steps = group_steps(problem, g, bound, tail_cap=problem.stage_cap)
        new = np.full(fronts * depth, -INF)
        front = (steps.front[None, :] + shift).ravel()  # per (copy, pair)
        copy_pair, tail = np.nonzero(np.tile(steps.valid, (copies, 1)) & np.isfinite(most[front]))
        pair = copy_pair % len(steps.pp) if len(steps.pp) else copy_pair
        keep = tail + steps.pp[pair] < depth
        copy_pair, pair, tail = copy_pair[keep], pair[keep], tail[keep]
        if len(pair):
            reach = most[front[copy_pair], tail] + steps.hi[pair, tail]
            destination_front = steps.destination[pair] + copy_pair // len(steps.pp) * problem.fronts
            np.maximum.at(new, destination_front * depth + tail + steps.pp[pair], reach)
        most = new.reshape(fronts, depth)
        _drop_dominated(most, -INF, np.maximum)
        if not np.isfinite(most).any():
            break
    return most


def place_most_together(jobs: list[tuple[OrderedGroups, int, np.ndarray]], bound: float) -> list[np.ndarray]:
    """One group placed onto each of several tables of most layers in one set of numpy calls: jobs[i] =
    (problem, g, its tables stacked along the front axis), every problem with the same fronts and layers
    (the chains of one orders_dp.AllOrders). The result per job: as place_most of that one group."""
    first = jobs[0][0]
    fronts, depth = first.fronts, first.stage_cap + 1
    sizes = [len(most) for _, _, most in jobs]
    tables = np.concatenate([most for _, _, most in jobs])
    reached = np.isfinite(tables)
    rows, targets, reach = [], [], []
    base = 0
    for (problem, g, _), size in zip(jobs, sizes):
        steps, copies = group_steps(problem, g, bound, tail_cap=problem.stage_cap), size // fronts
        count = len(steps.pp)
        if count:
            front = (steps.front[None, :] + (base // fronts + np.arange(copies))[:, None] * fronts).ravel()
            copy_pair, tail = np.nonzero(np.tile(steps.valid, (copies, 1)) & reached[front])
            pair = copy_pair % count
            keep = tail + steps.pp[pair] < depth
            copy_pair, pair, tail = copy_pair[keep], pair[keep], tail[keep]
            rows.append(front[copy_pair] * depth + tail)
            reach.append(steps.hi[pair, tail])
            targets.append((steps.destination[pair] + base + copy_pair // count * fronts) * depth + tail +
                           steps.pp[pair])
        base += size
    new = np.full(len(tables) * depth, -INF)
    if rows:
        np.maximum.at(new, np.concatenate(targets), tables.reshape(-1)[np.concatenate(rows)] + np.concatenate(reach))
    new = new.reshape(len(tables), depth)
    _drop_dominated(new, -INF, np.maximum)
    ends = np.cumsum([0] + sizes).tolist()
    return [new[start:stop] for start, stop in zip(ends, ends[1:])]


def feasible(problem: OrderedGroups, bound: float) -> bool:
    return most_layers(problem, bound) >= problem.layers


def bound_candidates(problem: OrderedGroups) -> np.ndarray:
    """Every value A * k + KW a stage's weight can take (k = 1..L), sorted: the bounds worth trying."""
    if problem.candidates is None:
        problem.candidates = _bound_candidates(problem)
    return problem.candidates


def _bound_candidates(problem: OrderedGroups) -> np.ndarray:
    return candidates_of_pairs(bound_pairs(problem), problem.layers)


def candidates_of_pairs(pairs: np.ndarray, layers: int) -> np.ndarray:
    """Every A * k + KW (k = 1..layers) of the (A, KW) pairs, sorted, each once (in C++: _dp.candidates;
    candidates_of_pairs_reference is the numpy one)."""
    return _dp.candidates(pairs, layers)


def candidates_of_pairs_reference(pairs: np.ndarray, layers: int) -> np.ndarray:
    pairs = np.unique(pairs, axis=0)
    counts = np.arange(1, layers + 1, dtype=float)
    values = (pairs[:, 1:2] + pairs[:, 0:1] * counts[None, :]).ravel()
    return np.unique(values)


def bound_pairs(problem: OrderedGroups) -> np.ndarray:
    """The (A, KW) of every stage kind the problem's groups can have (rows, possibly repeated)."""
    return np.concatenate([np.zeros((0, 2))] + [_group_bound_pairs(problem, g) for g in range(len(problem.options))])


def _group_bound_pairs(problem: OrderedGroups, g: int) -> np.ndarray:
    """bound_pairs of group g, made once per group key (problem.shared)."""
    key = ("bound pairs", problem.group_key(g))
    if key not in problem.shared:
        b_minus_alpha = problem.micro_batches - problem.alpha
        weights, fixed = [], []
        for option in problem.options[g]:
            sends = [option.inner_send_s] + [s for (tp, _), s in problem.boundary_send_s[g].items() if tp == option.tp]
            ends = [(2 * send, 0.0) for send in sends]
            if g == len(problem.options) - 1:
                ends.append((option.last_extra_s, option.last_update_s))
            if g == 0 and problem.starts_pipeline:
                ends += [(extra + option.first_extra_s, update + option.first_update_s) for extra, update in ends]
            for extra, update in ends:
                weights.append(b_minus_alpha * option.compute_s + option.update_s)
                fixed.append(b_minus_alpha * extra + update)
        problem.shared[key] = np.array([weights, fixed]).T.reshape(-1, 2)
    return problem.shared[key]


# ---- rebuilding the plan ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlacedGroup:
    option: Option
    stage_layers: list[int]  # in pipeline order


def rebuild(problem: OrderedGroups, solved: SumTables) -> list[PlacedGroup]:
    """The choices behind SumTables.best(), group by group from the pipeline's front."""
    value, front, tail = solved.best()
    walked = walk(problem, solved, range(len(problem.options) - 1, -1, -1), (front, tail, problem.layers, value))
    if walked is None:
        raise AssertionError("dynamic programme: no source state reproduces the optimum")
    return walked[0]


def walk(problem: OrderedGroups, solved: SumTables, groups: range,
         cell: tuple[int, int, int, float]) -> tuple[list[PlacedGroup], tuple[int, int, int, float]] | None:
    """From a cell (front, tail, layers, value) of the table after placing `groups` (from the end, as
    place_sums did) back to the table they were placed onto: each group's choice in pipeline order and the
    source cell; None when no source reproduces the cell's value."""
    front, tail, layers, value = cell
    placed: list[PlacedGroup] = []
    for s in range(len(solved.steps) - 1, -1, -1):
        g, steps = groups[s], solved.steps[s]
        found = _find_source(problem, steps, solved.tables[s], front, tail, layers, value)
        if found is None:
            return None
        pair, source_tail, group_layers, source_value = found
        option, source_front = steps.options[int(steps.option_index[pair])], int(steps.front[pair])
        allowances = _stage_allowances(problem, g, option, source_front, source_tail, solved.bound)
        placed.append(PlacedGroup(option=option, stage_layers=_spread(group_layers, allowances)))
        front, tail, layers, value = source_front, source_tail, layers - group_layers, source_value
    return placed, (front, tail, layers, value)


def _find_source(problem, steps: GroupSteps, previous, front, tail, layers, value):
    tolerance = 1e-9 * max(1.0, abs(value))
    for pair in np.nonzero(steps.destination == front)[0]:
        pp, rate, source_front = int(steps.pp[pair]), float(steps.compute_s[pair]), int(steps.front[pair])
        for source_tail in range(problem.tail_cap + 1):
            if min(source_tail + pp, problem.tail_cap) != tail or not steps.valid[pair, source_tail]:
                continue
            for group_layers in range(pp, int(min(steps.hi[pair, source_tail], layers)) + 1):
                before = previous[source_front, source_tail, layers - group_layers]
                if abs(before + rate * group_layers + steps.ks[pair] - value) <= tolerance:
                    return pair, source_tail, group_layers, float(before)
    return None


def _stage_allowances(problem: OrderedGroups, g: int, option: Option, front: int, tail: int, bound: float) -> list[int]:
    """Each stage's allowance (pipeline order within the group) at this tail."""
    b_minus_alpha = problem.micro_batches - problem.alpha
    front_tp = problem.front_tp(front)
    result = []
    for position in range(option.pp, 0, -1):
        first = g == 0 and problem.starts_pipeline and position == option.pp
        last = position == 1 and front_tp is None
        send = (0.0 if last else problem.boundary_send_s[g][(option.tp,
                                                             front_tp)] if position == 1 else option.inner_send_s)
        extra, update = _ends(option, first, last, send)
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
