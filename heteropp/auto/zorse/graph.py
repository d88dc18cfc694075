"""The cluster as machines and the bandwidth graph between them.

A machine is one node of one chip type (chips_per_node GPUs; the last node of a type holds the rest)
in its chip type's site. Two machines are joined by the link class h2.core.links assigns them
(inter_node, inter_type or inter_site, with the cluster file's overrides and site pairs); one machine's
GPUs by its intra_node link.

The graph has one vertex per machine and an edge between every two machines weighted by the
bandwidth of all their GPU pairs together: gpus_a * gpus_b * bandwidth (GB/s), the weight the GPU
graph of the Zorse paper gives the cut between the two machines. Zorse's planner tries k groups for k
from the number of machines down to 1, so no cut it uses splits a machine: cutting the machine graph
is cutting the GPU graph with each machine's GPUs kept together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from h2.core.cluster import ClusterSpec
from h2.core.errors import UserError
from h2.core.links import Link, Location, link_between


@dataclass(frozen=True)
class Machine:
    index: int
    chip: str
    node: int            # numbered per chip type, as h2.core.links numbers them
    site: str | None
    gpus: int

    @property
    def location(self) -> Location:
        return Location(self.chip, self.node, self.site)

    @property
    def label(self) -> str:
        return f"{self.chip}/{self.node}" + (f"@{self.site}" if self.site else "")


def machines_of(cluster: ClusterSpec) -> list[Machine]:
    """Every node of every chip type, in the cluster file's order."""
    machines: list[Machine] = []
    for chip in cluster.chips:
        full, rest = divmod(chip.count, chip.chips_per_node)
        for node, gpus in enumerate([chip.chips_per_node] * full + ([rest] if rest else [])):
            machines.append(Machine(len(machines), chip.name, node, chip.site, gpus))
    return machines


def link_of(cluster: ClusterSpec, a: Machine, b: Machine) -> Link:
    """The link between a GPU of machine a and one of machine b (a == b: the node's own link)."""
    return link_between(cluster, a.location, b.location)[1]


def slowest_link(cluster: ClusterSpec, machines: list[Machine]) -> Link:
    """The link a collective over these machines' GPUs is paced by: the lowest bandwidth and the
    highest latency among their pairs (each machine's own link when there is one machine)."""
    links = [link_of(cluster, a, b) for i, a in enumerate(machines) for b in machines[i:]
             if a.index != b.index or len(machines) == 1 or a.gpus > 1]
    return Link(min(link.bandwidth_gbps for link in links), max(link.latency_us for link in links))


def bandwidth_graph(cluster: ClusterSpec, machines: list[Machine]) -> nx.Graph:
    """Vertices: machine indices; edges: every pair, weight gpus_a * gpus_b * bandwidth in GB/s."""
    graph = nx.Graph()
    graph.add_nodes_from(machine.index for machine in machines)
    for i, a in enumerate(machines):
        for b in machines[i + 1:]:
            bandwidth = link_of(cluster, a, b).bandwidth_gbps
            if not (math.isfinite(bandwidth) and bandwidth > 0):
                raise UserError(f"{cluster.source}: the link between {a.label} and {b.label} must have a positive, "
                                f"finite bandwidth to partition the cluster, got {bandwidth}")
            graph.add_edge(a.index, b.index, weight=a.gpus * b.gpus * bandwidth)
    return graph
