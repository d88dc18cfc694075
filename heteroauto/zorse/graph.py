"""The cluster's machines and the bandwidth graph between them, from the cluster file's placement
(h2.core.placement: nodes in sites, node-, site- and site-pair bandwidths; a file without `nodes` has
each chip type fill its own nodes in one site).

A machine is one node of the placement (its `region` is the node's site). Two GPUs of one machine are
joined at the node's bandwidth, of two machines at their site's or their site pair's. A link inside a
site takes the larger latency_us of the chips it joins; a link between sites the `links: inter_site`
latency where the file gives one (else the same); a latency the placement writes on the node, the
site or the site pair replaces both. Between two
machines a link is also no faster than the class the emulated links pace it by (h2.core.links).

The graph has one vertex per machine and an edge between every two linked machines weighted by the
bandwidth of all their GPU pairs together: gpus_a * gpus_b * bandwidth (GB/s), the weight the GPU graph
of the Zorse paper gives the cut between the two machines. Zorse's planner tries k groups for k from
the number of machines down to 1, so no cut it uses splits a machine: cutting the machine graph is
cutting the GPU graph with each machine's GPUs kept together.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from h2.core.cluster import ClusterSpec
from h2.core.links import Link, Location, link_between, placement_of


@dataclass(frozen=True)
class Machine:
    index: int
    name: str
    region: str  # the node's site (h2.core.placement; "regions" in the planner's output)
    chips: tuple[str, ...]  # each GPU's chip type
    bandwidth_gbps: float  # between two of its GPUs (the node's)

    @property
    def gpus(self) -> int:
        return len(self.chips)

    @property
    def label(self) -> str:
        return self.name


def machines_of(cluster: ClusterSpec) -> list[Machine]:
    """Every node of the cluster graph, in the cluster file's order."""
    return [
        Machine(index, node.name, node.site, tuple(chip for chip, count in node.chips
                                                   for _ in range(count)), node.bandwidth_gbps)
        for index, node in enumerate(placement_of(cluster).nodes)
    ]


def _level_link(cluster: ClusterSpec, a: Machine, b: Machine):
    """The placement's link between the two machines' level (None: two sites without a direct link)."""
    return placement_of(cluster).level_link(a.name, b.name)


def _bandwidth_gbps(cluster: ClusterSpec, a: Machine, b: Machine) -> float:
    link = _level_link(cluster, a, b)
    return 0.0 if link is None else link.bandwidth_gbps


def link_of(cluster: ClusterSpec, a: Machine, b: Machine) -> Link:
    """The link between a GPU of machine a and one of machine b (a == b: the node's own link). Between
    two machines it is also no faster than the link class the emulated links pace it by
    (h2.core.links: inter_node or inter_type with the `links:` section's overrides)."""
    latency = max(cluster.chip(chip).latency_us for chip in set(a.chips) | set(b.chips))
    if a.region != b.region and cluster.links.override("inter_site").latency_us is not None:
        latency = cluster.links.override("inter_site").latency_us
    level = _level_link(cluster, a, b)
    if level is not None and level.latency_us is not None:
        latency = level.latency_us
    bandwidth = 0.0 if level is None else level.bandwidth_gbps
    if a.index != b.index:
        _, paced = link_between(cluster, Location(a.chips[0], a.index), Location(b.chips[0], b.index))
        bandwidth, latency = min(bandwidth, paced.bandwidth_gbps), max(latency, paced.latency_us)
    return Link(bandwidth, latency)


def slowest_link(cluster: ClusterSpec, machines: list[Machine]) -> Link:
    """The link a collective over these machines' GPUs is paced by: the lowest bandwidth and the
    highest latency among their pairs (the machine's own link when there is one machine)."""
    links = [
        link_of(cluster, a, b) for i, a in enumerate(machines) for b in machines[i:]
        if a.index != b.index or a.gpus > 1 or len(machines) == 1
    ]
    return Link(min(link.bandwidth_gbps for link in links), max(link.latency_us for link in links))


def link_across(cluster: ClusterSpec, first: list[Machine], second: list[Machine]) -> Link:
    """The slowest link from a machine of one group to a machine of the other."""
    links = [link_of(cluster, a, b) for a in first for b in second]
    return Link(min(link.bandwidth_gbps for link in links), max(link.latency_us for link in links))


def bandwidth_graph(cluster: ClusterSpec, machines: list[Machine]) -> nx.Graph:
    """Vertices: machine indices; edges: every linked pair, weight gpus_a * gpus_b * bandwidth in GB/s."""
    graph = nx.Graph()
    graph.add_nodes_from(machine.index for machine in machines)
    for i, a in enumerate(machines):
        for b in machines[i + 1:]:
            bandwidth = _bandwidth_gbps(cluster, a, b)
            if bandwidth > 0:
                graph.add_edge(a.index, b.index, weight=a.gpus * b.gpus * bandwidth)
    return graph
