"""The queries over a whole loaded cluster: its nodes, where each rank of a strategy sits, and which
link joins two ranks and how fast the bytes on it travel.

The cluster file says where its chips sit and the link of each level (h2.core.placement: a chip on a
node, a node in a site; within a node, between nodes of a site, between sites). Four link classes,
from the fastest to the slowest in a real cluster:

    intra_node   chips of one node (NVLink, HCCS, PCIe)
    inter_node   nodes of one site (of one chip type where the file has no `nodes` section)
    inter_type   nodes of two chip types in one site (a file without `nodes`)
    inter_site   between sites (cross-datacenter); a pair of sites may have its own link

Where ranks sit (`rank_locations`), in a file without `nodes`: a strategy's stages take consecutive
global ranks; each chip type fills its nodes (chips_per_node) in rank order, and a node holds one
contiguous block of ranks, so a chip type that comes back after another type's stage starts a fresh
node. A stage sits in the site it names (`site:` in the strategy), else in its chip type's (`site:` in
the cluster file), else in the default site (None); a stage in another site than the previous one
starts a fresh node too. The link between two ranks is their class's: the `links:` section's entry
over the chip types' own fields (h2.core.placement), and between two sites their pair's entry over that.

Where the cluster file places its chips on named nodes (its `nodes` section), each rank of chip type
X takes the next chip of type X in the file's node order instead, and the link between two ranks is
the placement's: intra_node at the node's, inter_node at the site's, inter_site at the site pair's
(without a direct pair: the slowest pair), a latency the file leaves out the larger of the two chips'
latency_us; the `links:` classes do not apply to such ranks.

The arrival rule (`ArrivalClock`) is what every pacing layer applies to the messages it sends over one
link: a message of n bytes posted at t arrives at max(previous arrival, t + latency) + n / bandwidth;
the sender never waits for an acknowledgement, so many messages are in flight at once.

Pure Python: no torch, nothing of the project above core; imports h2.core.cluster (never the reverse).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from h2.core.cluster import ChipType, ClusterSpec
from h2.core.errors import UserError
from h2.core.placement import (
    LINK_CLASSES,
    Link,
    LinkOverride,
    LinkSection,
    Placement,
    default_placement,
    links_from_mapping,
    slowest,
)

if TYPE_CHECKING:
    from h2.core.strategy import Strategy

__all__ = [
    "LINK_CLASSES", "ArrivalClock", "Link", "LinkOverride", "LinkSection", "Location", "RankLinks",
    "describe_stage_links", "link_between", "link_class", "links_from_mapping", "nodes_of", "placement_of",
    "rank_locations", "slowest", "stage_link", "stage_site"
]


def placement_of(cluster: ClusterSpec) -> Placement:
    """Every chip's node and site and the link of each level: the file's `nodes` section, else each
    chip type filling its own nodes of chips_per_node in one site (h2.core.placement)."""
    if cluster.placed is not None:
        return cluster.placed
    return _filled_placement(
        tuple((chip.name, chip.count, chip.chips_per_node, chip.intra_node_gbps, chip.inter_node_gbps)
              for chip in cluster.chips))


@functools.lru_cache(maxsize=64)
def _filled_placement(chips: tuple[tuple[str, int, int, float, float], ...]) -> Placement:
    """Computed once per set of chip types (the planner asks for every pair of machines)."""
    return default_placement(list(chips))


@dataclass(frozen=True)
class Location:
    """Where a rank sits: its chip type, its node and its site. Where the cluster file names its nodes,
    `node_name` is the node's name and `node` its index in the file; else `node` counts the nodes of
    the chip type."""
    chip: str
    node: int
    site: str | None = None
    node_name: str | None = None

    def describe(self) -> str:
        if self.node_name is not None:
            return f"node {self.node_name} in site {self.site}"
        site = f" at site {self.site}" if self.site else ""
        return f"{self.chip} node {self.node}{site}"

    @property
    def machine(self):
        """What identifies the node the rank runs on: the named node, else the whole location."""
        return self if self.node_name is None else (self.node_name, self.site)


def link_class(a: Location, b: Location) -> str:
    """The class of the link between two ranks' locations."""
    if a.node_name is not None and b.node_name is not None:
        if a.node_name == b.node_name:
            return "intra_node"
        return "inter_node" if a.site == b.site else "inter_site"
    if a.site != b.site:
        return "inter_site"
    if a.chip != b.chip:
        return "inter_type"
    if a.node != b.node:
        return "inter_node"
    return "intra_node"


def _default_link(link_class_name: str, chip_a: ChipType, chip_b: ChipType) -> Link:
    if link_class_name == "intra_node":
        return Link(chip_a.intra_node_gbps, chip_a.latency_us)
    if chip_a.name == chip_b.name:
        return Link(chip_a.inter_node_gbps, chip_a.latency_us)
    return Link(min(chip_a.inter_node_gbps, chip_b.inter_node_gbps), max(chip_a.latency_us, chip_b.latency_us))


def link_between(cluster: ClusterSpec, a: Location, b: Location) -> tuple[str, Link]:
    """The class of the link joining two locations of `cluster`, and its bandwidth and latency."""
    name = link_class(a, b)
    if a.node_name is not None and b.node_name is not None:
        latency = max(cluster.chip(a.chip).latency_us, cluster.chip(b.chip).latency_us)
        return name, placement_of(cluster).node_link(a.node_name, b.node_name, latency)
    default = _default_link(name, cluster.chip(a.chip), cluster.chip(b.chip))
    link = cluster.links.override(name).over(default)
    if name == "inter_site":
        pair = cluster.links.site_pair(a.site, b.site)
        if pair is not None:
            link = pair.over(link)
    return name, link


def rank_locations(strategy: "Strategy", cluster: ClusterSpec, source: str = "strategy") -> list[Location]:
    """Each global rank's location (module doc: nodes fill in rank order, one contiguous block each;
    or the cluster file's named nodes)."""
    if cluster.placed is not None:
        return _placed_locations(strategy, cluster, source)
    locations: list[Location] = []
    next_node: dict[str, int] = {}  # per chip type: the first node no rank has used yet
    filled = 0  # ranks on the current node
    for index, stage in enumerate(strategy.stages):
        site = stage_site(strategy, cluster, index, source)
        for replica in range(strategy.stage_dp(index)):
            chip = cluster.chip(stage.replica_chip(replica))
            for _ in range(stage.tp):
                previous = locations[-1] if locations else None
                if (previous is None or previous.chip != chip.name or previous.site != site
                        or filled == chip.chips_per_node):
                    next_node[chip.name] = next_node.get(chip.name, -1) + 1
                    filled = 0
                locations.append(Location(chip.name, next_node[chip.name], site))
                filled += 1
    for chip_name, last in next_node.items():
        chip = cluster.chip(chip_name)
        nodes = -(-chip.count // chip.chips_per_node)
        if last + 1 > nodes:
            raise UserError(f"{source}: field 'stages': places chip type '{chip_name}' on {last + 1} nodes "
                            f"({chip.chips_per_node} chips each, one contiguous block of ranks per node), cluster "
                            f"{cluster.source} has {nodes}")
    return locations


def stage_site(strategy: "Strategy", cluster: ClusterSpec, index: int, source: str = "strategy") -> str | None:
    """The site stage `index` runs in (module doc); a site the cluster does not name is a UserError."""
    stage = strategy.stages[index]
    if stage.site is None:
        return cluster.chip(stage.chip).site
    if stage.site not in cluster.sites:
        known = ", ".join(sorted(cluster.sites)) or "none"
        raise UserError(f"{source}: field 'stages[{index}].site': unknown site '{stage.site}' "
                        f"(cluster {cluster.source} names: {known})")
    return stage.site


def _placed_locations(strategy: "Strategy", cluster: ClusterSpec, source: str) -> list[Location]:
    """Each rank of chip type X on the next chip of type X in the cluster file's node order."""
    placement = placement_of(cluster)
    node_index = {node.name: index for index, node in enumerate(placement.nodes)}
    free: dict[str, list] = {}
    for gpu in placement.gpus():
        free.setdefault(gpu.chip, []).append(gpu)
    locations = []
    for chip_name in strategy.rank_chips():
        cluster.chip(chip_name)
        if not free.get(chip_name):
            raise UserError(f"{source}: field 'stages': uses more chips of type '{chip_name}' than cluster "
                            f"{cluster.source} places on its nodes")
        gpu = free[chip_name].pop(0)
        locations.append(Location(chip_name, node_index[gpu.node], gpu.site, node_name=gpu.node))
    return locations


def nodes_of(locations: list[Location]) -> list[tuple[Location, list[int]]]:
    """The distinct nodes in rank order, each with its (contiguous) global ranks."""
    nodes: list[tuple[Location, list[int]]] = []
    for rank, location in enumerate(locations):
        if nodes and nodes[-1][0].machine == location.machine:
            nodes[-1][1].append(rank)
        else:
            nodes.append((location, [rank]))
    return nodes


class PeerLinks(Protocol):
    """What the pacing layers ask of one rank's links (heteropp's groups and P2P): the link to each peer
    and its class. RankLinks answers from a loaded cluster; a pipeline rank's answer comes from its job
    file (h2.launch.job.JobLinks)."""
    rank: int

    def to(self, peer: int) -> Link:
        ...

    def class_to(self, peer: int) -> str:
        ...

    def shaped_by_kernel(self, peer: int) -> bool:
        ...

    def link_to(self, peer: int) -> Link:
        ...


def paced_link(link: Link, across_nodes: bool, kernel_shaped: bool) -> Link:
    """What pacing applies on `link`: all of it, except where the kernel already shapes the bandwidth
    between nodes (`kernel_shaped`: network namespaces with tc shaping), where only its latency is paced."""
    return link.without_bandwidth() if kernel_shaped and across_nodes else link


class RankLinks:
    """The link from one rank to every other of a job: what its pacing layers apply per peer
    (`paced_link`: with `kernel_shaped`, only the latency between nodes)."""

    def __init__(self, cluster: ClusterSpec, locations: list[Location], rank: int, kernel_shaped: bool = False):
        self.cluster, self.locations, self.rank = cluster, locations, rank
        self.kernel_shaped = kernel_shaped

    @classmethod
    def for_strategy(cls, strategy: "Strategy", cluster: ClusterSpec, rank: int,
                     kernel_shaped: bool = False) -> "RankLinks":
        return cls(cluster, rank_locations(strategy, cluster), rank, kernel_shaped)

    def to(self, peer: int) -> Link:
        """What pacing applies to messages from this rank to global rank `peer`."""
        here, there = self.locations[self.rank], self.locations[peer]
        _, link = link_between(self.cluster, here, there)
        return paced_link(link, here.machine != there.machine, self.kernel_shaped)

    def class_to(self, peer: int) -> str:
        return link_class(self.locations[self.rank], self.locations[peer])

    def link_to(self, peer: int) -> Link:
        """The link to global rank `peer` itself (bandwidth included, whoever shapes it)."""
        return link_between(self.cluster, self.locations[self.rank], self.locations[peer])[1]

    def shaped_by_kernel(self, peer: int) -> bool:
        """Whether the kernel shapes the bandwidth of messages to `peer` (paced_link)."""
        return self.kernel_shaped and self.locations[self.rank].machine != self.locations[peer].machine


def stage_link(strategy: "Strategy", cluster: ClusterSpec, locations: list[Location], src: int, dst: int) -> Link:
    """The slowest link between any rank of stage `src` and any rank of stage `dst`."""
    ranks = strategy.stage_ranks()
    nodes_a = {locations[r] for r in ranks[src]}
    nodes_b = {locations[r] for r in ranks[dst]}
    return slowest([link_between(cluster, a, b)[1] for a in nodes_a for b in nodes_b])


class ArrivalClock:
    """The arrival rule of one link, in seconds on any monotonic clock (module doc)."""

    def __init__(self, link: Link):
        self.link = link
        self._last_arrival = -math.inf

    def arrival(self, now: float, nbytes: int) -> float:
        """When a message of `nbytes` posted at `now` arrives; later messages queue behind it."""
        start = max(self._last_arrival, now + self.link.latency_s)
        self._last_arrival = start + nbytes / self.link.bytes_per_s
        return self._last_arrival


def describe_stage_links(strategy: "Strategy", links: RankLinks) -> str:
    """One line per stage boundary: the link classes its ranks' traffic crosses (emulated); with
    ministages over several stages also the wrap-around from the last stage to stage 0."""
    ranks = strategy.stage_ranks()
    pairs = [(boundary, boundary + 1, "") for boundary in range(len(ranks) - 1)]
    if strategy.ministages > 1 and len(ranks) > 1:
        pairs.append((len(ranks) - 1, 0, "wrap-around, "))
    lines = []
    for src, dst, label in pairs:
        used = sorted(
            {
                link_between(links.cluster, links.locations[a], links.locations[b]) for a in ranks[src]
                for b in ranks[dst]
            }, key=lambda item: (LINK_CLASSES.index(item[0]), item[1].latency_us, -item[1].bandwidth_gbps))
        text = "; ".join(f"{name} {link.describe()}" for name, link in used)
        lines.append(f"link stage {src} -> {dst} ({label}emulated): {text}")
    return "\n".join(lines)
