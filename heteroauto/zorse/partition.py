"""Phase 1: partition the bandwidth graph into k groups for every k, cutting as little bandwidth as
possible (min-k-cut), with the SPLIT greedy approximation (Saran and Vazirani 1995).

SPLIT: while there are fewer than n components, find the minimum 2-cut of every component with more
than one vertex (Stoer-Wagner), remove the edges of the lightest one. Each removal adds exactly one
component (the two sides of a minimum cut of a connected graph with positive weights are connected),
so one pass gives the partitions for k = 1 .. n; the k-partition cuts at most (2 - 2/k) times the
optimum k-cut's weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from h2.core.errors import UserError


@dataclass(frozen=True)
class Partition:
    groups: tuple[tuple, ...]  # each group's vertices, sorted; groups in order of their first vertex
    cut_weight: float  # weight of the edges between groups

    @property
    def k(self) -> int:
        return len(self.groups)


def _partition(graph: nx.Graph, cut_weight: float) -> Partition:
    groups = sorted(tuple(sorted(component)) for component in nx.connected_components(graph))
    return Partition(tuple(groups), cut_weight)


def split_partitions(graph: nx.Graph, what: str = "graph") -> list[Partition]:
    """The SPLIT partitions of a connected graph into 1, 2, ..., n groups (list index k - 1)."""
    if graph.number_of_nodes() == 0:
        raise UserError(f"{what}: nothing to partition (no vertices)")
    for u, v, weight in graph.edges(data="weight", default=1):
        if not weight > 0:
            raise UserError(f"{what}: edge {u}-{v} has weight {weight}; bandwidths must be positive")
    if not nx.is_connected(graph):
        parts = [sorted(component) for component in nx.connected_components(graph)]
        raise UserError(f"{what}: not connected: no link joins {parts[0]} to {parts[1]} "
                        f"({len(parts)} disconnected parts)")
    work = graph.copy()
    cut = 0.0
    partitions = [_partition(work, cut)]
    while len(partitions) < graph.number_of_nodes():
        best = None
        for component in sorted(nx.connected_components(work), key=min):
            if len(component) < 2:
                continue
            value, (side, _) = nx.stoer_wagner(work.subgraph(component), weight="weight")
            if best is None or value < best[0]:
                best = (value, set(side), component)
        value, side, component = best
        work.remove_edges_from([(u, v) for u in side for v in list(work[u]) if v in component and v not in side])
        cut += value
        partitions.append(_partition(work, cut))
    return partitions


def cut_weight(graph: nx.Graph, groups) -> float:
    """Weight of the edges whose ends lie in different groups."""
    group_of = {vertex: index for index, group in enumerate(groups) for vertex in group}
    return sum(weight for u, v, weight in graph.edges(data="weight", default=1) if group_of[u] != group_of[v])


def split_bound(k: int) -> float:
    """SPLIT's approximation factor for k groups."""
    return 2 - 2 / k
