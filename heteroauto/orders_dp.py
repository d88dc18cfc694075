"""Every stage order at once: over all orders of the chip types, the least sum of stage terms under a
bound M, and whether the layers fit under M at all, by a dynamic programme over the sets of types placed
from the pipeline's end (Held-Karp). The state after placing a set S of types is (S, the type in front,
its front tp, stages behind, layers placed), so k types cost k 2^(k-1) states where the orders are k!.

A type t placed in front of type f reads f only through the transfer from t's last group to f's first
group, so t's last group is placed once per f, the minimum over f taken, and t's other groups placed once.
The per-type pieces are layer_dp chains built by the caller: t's groups followed by f's first group (which
only supplies the transfer and is not placed), sharing one set of tp slices. Under a bound M, layer counts
that the groups still to place cannot complete to L (at least one layer each, at most what their stages
admit under M anywhere) are cleared after each type. The sum tables are kept by their reachable rows
(layer_dp.Rows: about one row in a hundred), and each step's placements, every chain's at once, are one
set of numpy calls (layer_dp.place_sums_rows, place_most_together). What the search asks (least_sum,
most_layers, feasible, best_order) is one call each into the C++ extension heteroauto._dp (native(): the
chains' group shapes flattened once); the numpy sweep here (*_reference) is what the tests compare it
against. Imports layer_dp and _dp only (no search code, no torch).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from heteroauto import _dp, layer_dp
from heteroauto.layer_dp import INF, OrderedGroups, SumTables

Chain = Callable[[str, "str | None", bool], OrderedGroups]  # (type, next type or None: the end, starts)


@dataclass
class AllOrders:
    """The problem of every order of `types` at one (dp, grouping)."""
    types: tuple[str, ...]
    chain: Chain
    alpha: float
    layers: int
    _candidates: np.ndarray | None = field(default=None, repr=False)
    _least_rate: float | None = field(default=None, repr=False)  # least time of one layer in any option
    _limits: tuple = field(default=(None, None), repr=False)  # (bound, _group_layer_limits) of the last bound
    _native: _dp.AllOrders | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        sample = self.chain(self.types[0], None, len(self.types) == 1)
        self.fronts, self.tail_cap, self.stage_cap = sample.fronts, sample.tail_cap, sample.stage_cap

    # ---- the sweep over sets of types ----------------------------------------------------------------
    def _sweep(self, start, place_one: Callable, place_rest: Callable, merge, keep: bool = False,
               trim: Callable | None = None, reachable: Callable = lambda table: bool(np.isfinite(table).any())):
        """Tables after every (set, front type), built by set size; with keep, also each type's table
        after only its last group (partial), for tracing the order back. All placements of one step are handed
        over at once, grouped by chain (same type, same next type): place_*([(chain, tables, keys), ...])
        -> per chain its tables, keys[i] = (the set once the type is placed, the type). trim(placed set, type whose last
        group alone is placed or -1, table): clears what cannot finish. Tables: numpy arrays, or whatever the
        place_* functions, merge and reachable(table) take (layer_dp.Rows for sums)."""
        count, full = len(self.types), (1 << len(self.types)) - 1
        level: dict[tuple[int, int], object] = {(0, -1): start}
        kept: dict = {}
        for _ in range(count):
            jobs: dict[tuple[int, int, bool], list[tuple[int, object]]] = {}
            for (mask, front), table in level.items():
                if not reachable(table):
                    continue  # nothing reachable: no order through this state
                for t in range(count):
                    if not mask >> t & 1:
                        jobs.setdefault((t, front, (mask | 1 << t) == full), []).append((mask, table))
            arrivals: dict[tuple[int, int], list] = {}
            batches = [(self._chain(t, front, starts), [table for _, table in entries], [(mask | 1 << t, t)
                                                                                         for mask, _ in entries])
                       for (t, front, starts), entries in jobs.items()]
            for (_, _, keys), placed in zip(batches, place_one(batches) if batches else []):
                for key, after in zip(keys, placed):
                    arrivals.setdefault(key, []).append(after)
            partial = {key: merge(tables) for key, tables in arrivals.items()}  # merge(tables) -> one table
            if trim is not None:
                for (mask, t), table in partial.items():
                    trim(mask, t, table)
            rest: dict[tuple[int, bool], list[tuple[int, int]]] = {}
            for key in partial:
                rest.setdefault((key[1], key[0] == full), []).append(key)
            level = {}
            batches = [(self._chain(t, -1, starts), [partial[key] for key in keys], keys)
                       for (t, starts), keys in rest.items()]
            for (_, _, keys), placed in zip(batches, place_rest(batches) if batches else []):
                level.update(zip(keys, placed))
            if trim is not None:
                for (mask, _), table in level.items():
                    trim(mask, -1, table)
            if keep:
                kept.update({("partial", ) + key: table for key, table in partial.items()})
                kept.update({("level", ) + key: table for key, table in level.items()})
        return level, kept

    def _chain(self, t: int, front: int, starts: bool) -> OrderedGroups:
        return self.chain(self.types[t], None if front < 0 else self.types[front], starts)

    def _least_rate_of(self) -> float:
        if self._least_rate is None:
            chains = [self._chain(t, -1, starts) for t in range(len(self.types)) for starts in (False, True)]
            self._least_rate = min(o.compute_s for chain in chains for options in chain.options for o in options)
        return self._least_rate

    def _sum_sweep(self, bound: float, keep: bool = False, cap: float = INF):
        self._least_rate_of()

        least_rest = self._least_rest(bound) if cap < INF else None

        def together(batches: list, step: int, live: list[int], groups: list[range], stacked: list) -> list:
            jobs = [(batches[i][0], groups[i][step], stacked[i], None if least_rest is None else np.array(
                [least_rest(mask, t, groups[i][step]) for mask, t in batches[i][2]])) for i in live]
            return layer_dp.place_sums_rows(jobs, bound, cap, self._least_rate)

        one, rest = _together(together, stack=list, unstack=lambda table, count: table)
        start = layer_dp.Rows(rows=np.array([(self.fronts - 1) * (self.tail_cap + 1)]), values=np.full(
            (1, self.layers + 1), INF))
        start.values[0, 0] = 0.0
        return self._sweep(start, one, rest, layer_dp.Rows.merged, keep, self._layer_trim(bound),
                           reachable=layer_dp.Rows.reachable)

    def _layer_trim(self, bound: float) -> Callable:
        """trim for sum tables under M: clear the layer counts the groups still to place cannot complete to
        L, holding at least one layer each and at most what their stages admit under M at any position."""
        most = self._group_layer_limits(bound)

        def trim(mask: int, partial: int, table: layer_dp.Rows) -> None:
            ahead = [t for t in range(len(self.types)) if not mask >> t & 1]
            most_ahead = sum(float(most[t].sum()) for t in ahead)
            count_ahead = sum(len(most[t]) for t in ahead)
            if partial >= 0:  # the type's other groups are still to place
                most_ahead += float(most[partial][:-1].sum())
                count_ahead += len(most[partial]) - 1
            fewest = self.layers - most_ahead  # layers placed below this cannot reach L
            if fewest > 0:
                table.values[:, :math.ceil(min(fewest, self.layers + 1))] = INF
            table.values[:, max(0, self.layers - count_ahead + 1):] = INF

        return trim

    def _least_rest(self, bound: float) -> Callable[[int, int, int], np.ndarray]:
        """least_rest(set, type, g) -> per layers placed, a lower bound on the sum the groups still to place
        add once type's group g is placed (the type's groups before g and every type outside the set): at
        least one layer per group, at most what it admits under M, each layer at its group's least rate,
        the cheapest groups filled first; inf where they cannot complete L."""
        most = self._group_layer_limits(bound)
        rates = [
            np.array([min(o.compute_s for o in options) for options in chain.options[:len(most[t])]])
            for t, chain in enumerate(self._chain(t, -1, False) for t in range(len(self.types)))
        ]
        known: dict[tuple[int, int, int], np.ndarray] = {}
        to_place = self.layers - np.arange(self.layers + 1, dtype=float)

        def least_rest(mask: int, t: int, g: int) -> np.ndarray:
            key = (mask, t, g)
            if key not in known:
                ahead = [u for u in range(len(self.types)) if not mask >> u & 1]
                rate = np.concatenate([rates[u] for u in ahead] + [rates[t][:g], [0.0]])[:-1]
                room = np.concatenate([most[u] for u in ahead] + [most[t][:g], [0.0]])[:-1]
                known[key] = _least_fill(to_place, rate, room)
            return known[key]

        return least_rest

    def _group_layer_limits(self, bound: float) -> list[np.ndarray]:
        """Per type, per group (pipeline order), the most layers the group's stages admit under M in any
        order, position and front (a valid step's hi at any tail)."""
        if self._limits[0] != bound:
            self._limits = (bound, self._layer_limits(bound))
        return self._limits[1]

    def _layer_limits(self, bound: float) -> list[np.ndarray]:
        count, most = len(self.types), []
        for t in range(count):
            limits = None
            for front in range(-1, count):
                if front == t:
                    continue
                for starts in (False, True):
                    chain = self._chain(t, front, starts)
                    placed = len(chain.options) - chain.follower
                    here = np.array([_most_of(layer_dp.group_steps(chain, g, bound)) for g in range(placed)])
                    limits = here if limits is None else np.maximum(limits, here)
            most.append(limits)
        return most

    # ---- what the search asks: one C++ call each (_dp) ---------------------------------------------------
    def least_sum(self, bound: float, cap: float = INF) -> float:
        """The least sum of stage terms over every order under bound M (inf: nothing fits); a value >= cap
        means only 'not below cap' (layer_dp.place_sums)."""
        return self.native().least_sum(bound, cap)

    def most_layers(self, bound: float) -> float:
        return self.native().most_layers(bound)

    def feasible(self, bound: float) -> bool:
        return self.most_layers(bound) >= self.layers

    def native(self) -> _dp.AllOrders:
        """The problem in C++: per (type, front type or the end, starts) the shape of the type's last group,
        per (type, starts) its other groups' (from its end), at the most layers' tail cap (the sums read the
        first tail_cap + 1 tails of each: the same steps)."""
        if self._native is None:
            count = len(self.types)
            registry = layer_dp.native_registry(self._chain(0, -1, count == 1))

            def shape(chain: OrderedGroups, g: int) -> int:
                return layer_dp.native_shape(chain, g, self.stage_cap, registry)

            def last_shape(t: int, front: int, starts: bool) -> int:
                if front == t:
                    return -1  # no such chain
                chain = self._chain(t, front, starts)
                return shape(chain, _last_group(chain)[0])

            last = [
                last_shape(t, front, starts) for t in range(count) for front in range(-1, count)
                for starts in (False, True)
            ]
            rest = [[shape(chain, g) for g in range(len(chain.options) - 2, -1, -1)]
                    for chain in (self._chain(t, -1, starts) for t in range(count) for starts in (False, True))]
            self._native = _dp.AllOrders(shapes=registry[0], types=count, last=last, rest=rest, fronts=self.fronts,
                                         tail_cap=self.tail_cap, stage_cap=self.stage_cap, layers=self.layers,
                                         least_rate=self._least_rate_of())
        return self._native

    # ---- the numpy reference (tests compare the C++ against it; best_order traces in its tables) -------------
    def least_sum_reference(self, bound: float, cap: float = INF) -> float:
        level, _ = self._sum_sweep(bound, cap=cap)
        return min((table.least_last() for table in level.values()), default=INF)

    def most_layers_reference(self, bound: float) -> float:
        start = np.full((self.fronts, self.stage_cap + 1), -INF)
        start[self.fronts - 1, 0] = 0.0

        def together(batches: list, step: int, live: list[int], groups: list[range], stacked: list) -> list:
            return layer_dp.place_most_together([(batches[i][0], groups[i][step], stacked[i]) for i in live], bound)

        def unstack(table: np.ndarray, count: int) -> list[np.ndarray]:
            size = len(table) // count
            return [table[i * size:(i + 1) * size] for i in range(count)]

        one, rest = _together(together, stack=np.concatenate, unstack=unstack)
        level, _ = self._sweep(start, one, rest, lambda tables: functools.reduce(np.maximum, tables))
        return max((float(table.max()) for table in level.values()), default=-INF)

    def bound_values(self) -> np.ndarray:
        """Every value a stage's weight can take in any order (see layer_dp.bound_candidates)."""
        if self._candidates is None:
            count = len(self.types)
            chains = [
                self._chain(t, front, starts) for t in range(count) for front in range(-1, count) if front != t
                for starts in (False, True)
            ]
            self._candidates = layer_dp.candidates_of_pairs(np.concatenate([layer_dp.bound_pairs(c)
                                                                            for c in chains]), self.layers)
        return self._candidates

    def best_order(self, bound: float, cap: float = INF) -> tuple[str, ...]:
        """An order whose least sum under M is the least over every order (types from the pipeline's front);
        cap: above that least sum (the states that cannot end below it dropped; the trace reads none)."""
        return tuple(self.types[t] for t in self.native().best_order(bound, cap))

    def best_order_reference(self, bound: float, cap: float = INF) -> tuple[str, ...]:
        """best_order traced in the numpy tables."""
        level, kept = self._sum_sweep(bound, keep=True, cap=cap)
        tails = self.tail_cap + 1
        level = {key: table.dense(self.fronts, tails) for key, table in level.items()}
        kept = {key: table.dense(self.fronts, tails) for key, table in kept.items()}
        count, full = len(self.types), (1 << len(self.types)) - 1
        front = min(range(count), key=lambda t: float(level[(full, t)][:, :, -1].min()) if (full, t) in level else INF)
        table = level[(full, front)][:, :, -1]
        j, tail = np.unravel_index(int(np.argmin(table)), table.shape)
        cell = (int(j), int(tail), self.layers, float(table[j, tail]))
        mask, order = full, []
        while mask:
            order.append(self.types[front])
            rest_chain = self._chain(front, -1, mask == full)
            groups = range(len(rest_chain.options) - 2, -1, -1)
            tables, steps = layer_dp.place_sums(rest_chain, kept[("partial", mask, front)], bound, groups)
            cell = self._walk(rest_chain, tables, steps, groups, cell, bound)
            mask ^= 1 << front
            sources = [f for f in range(count) if mask >> f & 1] or [-1]
            for source in sources:
                chain = self._chain(front, source, (mask | 1 << front) == full)
                last = len(chain.options) - 1 - chain.follower
                table = kept.get(("level", mask, source)) if source >= 0 else self._start_sum()
                if table is None:
                    continue
                tables, steps = layer_dp.place_sums(chain, table, bound, range(last, last - 1, -1))
                walked = self._walk(chain, tables, steps, range(last, last - 1, -1), cell, bound, strict=False)
                if walked is not None:
                    cell, front = walked, source
                    break
            else:
                raise AssertionError("orders dynamic programme: no type reproduces the optimum")
        return tuple(order)

    def _start_sum(self) -> np.ndarray:
        start = np.full((self.fronts, self.tail_cap + 1, self.layers + 1), INF)
        start[self.fronts - 1, 0, 0] = 0.0
        return start

    @staticmethod
    def _walk(chain, tables, steps, groups, cell, bound, strict: bool = True):
        if not steps:
            return cell
        walked = layer_dp.walk(chain, SumTables(bound=bound, tables=tables, steps=steps), groups, cell)
        if walked is None:
            if strict:
                raise AssertionError("orders dynamic programme: a type's groups do not reproduce the optimum")
            return None
        return walked[1]


def _last_group(chain: OrderedGroups) -> range:
    """The chain's last placed group (its follower, if any, only gives the transfer)."""
    last = len(chain.options) - 1 - chain.follower
    return range(last, last - 1, -1)


def _together(together: Callable, stack: Callable, unstack: Callable) -> tuple[Callable, Callable]:
    """The sweep's place_one (each chain's last placed group) and place_rest (its other groups, from the
    end) from together(batches, step, live, groups, stacked): every live batch's step-th group placed on
    its stacked tables (stack(tables); unstack(stacked, count) -> the tables) in one set of numpy calls,
    the new stacked tables returned in live's order."""

    def place(batches: list, groups: list[range]) -> list[list]:
        stacked = [stack(tables) for _, tables, _ in batches]
        for step in range(max(len(r) for r in groups)):
            live = [i for i, r in enumerate(groups) if step < len(r)]
            for i, table in zip(live, together(batches, step, live, groups, stacked)):
                stacked[i] = table
        return [unstack(table, len(tables)) for table, (_, tables, _) in zip(stacked, batches)]

    def one(batches: list) -> list[list]:
        return place(batches, [_last_group(chain) for chain, _, _ in batches])

    def rest(batches: list) -> list[list]:
        return place(batches, [range(len(chain.options) - 2, -1, -1) for chain, _, _ in batches])

    return one, rest


def _least_fill(counts: np.ndarray, rate: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Per count n, the least sum of rate * layers over groups holding n layers in all, one to room
    layers each (inf where no such split exists): one layer each, the rest to the cheapest first."""
    if (room < 1).any():
        return np.full(len(counts), INF)
    order = np.argsort(rate, kind="stable")
    rate, extra = rate[order], room[order] - 1
    spare = counts - len(rate)
    before = np.cumsum(extra) - extra  # layers beyond one each taken by the cheaper groups
    taken = np.clip(spare[:, None] - before[None, :], 0, extra[None, :])
    total = float(rate.sum()) + (taken * rate[None, :]).sum(axis=1)
    return np.where((spare < 0) | (spare > extra.sum()), INF, total)


def _most_of(steps: layer_dp.GroupSteps) -> float:
    """The most layers any valid step of a group holds (-inf: none is valid)."""
    held = steps.hi[steps.valid]
    return float(held.max()) if held.size else -INF
