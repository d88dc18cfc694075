"""Link classes: which link joins two ranks, and how fast the bytes on it travel.

Four classes, from the fastest to the slowest in a real cluster:

    intra_node   chips of one node (NVLink, HCCS, PCIe)
    inter_node   nodes of one chip type (one vendor's network)
    inter_type   between chip types (nodes of different vendors)
    inter_site   between sites (cross-datacenter); a pair of sites may have its own link

Each has a bandwidth in GB/s (10^9 bytes/s) and a one-way latency in microseconds. A cluster file's
`links:` section sets them for the whole cluster (either field may be left out); what it leaves out
comes from the chip types' own fields, which stay the defaults:

    intra_node   the chip's intra_node_gbps and latency_us
    inter_node   the chip's inter_node_gbps and latency_us
    inter_type   the slower of the two chips' inter_node_gbps, the larger latency_us
    inter_site   as inter_type (as inter_node between chips of one type)

    links:
      inter_type: {bandwidth_gbps: 0.5, latency_us: 200}
      inter_site: {bandwidth_gbps: 0.1, latency_us: 20000}
      site_pairs:
        - {sites: [north, south], bandwidth_gbps: 0.05, latency_us: 30000}

Where ranks sit (`rank_locations`): a strategy's stages take consecutive global ranks; each chip type
fills its nodes (chips_per_node) in rank order, and a node holds one contiguous block of ranks, so a
chip type that comes back after another type's stage starts a fresh node. A stage sits in the site it
names (`site:` in the strategy), else in its chip type's (`site:` in the cluster file), else in the
default site (None); a stage in another site than the previous one starts a fresh node too.

    chips:
      - {name: A, site: north, ...}
      - {name: B, site: south, ...}

Where the cluster file places its chips on named nodes (its `nodes` section, h2.core.cluster_graph),
each rank of chip type X takes the next chip of type X in the file's node order instead, and the
link between two ranks is the graph's: intra_node at the node's link_gbps, inter_node at the region's,
inter_site at the region pair's (without a direct pair: the slowest region link), latency the larger
of the two chips' latency_us; the `links:` section does not apply to such ranks.

The arrival rule (`ArrivalClock`) is what every pacing layer applies to the messages it sends over one
link: a message of n bytes posted at t arrives at max(previous arrival, t + latency) + n / bandwidth;
the sender never waits for an acknowledgement, so many messages are in flight at once.

Pure Python: no torch, nothing of the project above core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from h2.core.cluster_graph import name_pair
from h2.core.errors import UserError

if TYPE_CHECKING:
    from h2.core.cluster import ChipType, ClusterSpec
    from h2.core.strategy import Strategy

LINK_CLASSES = ("intra_node", "inter_node", "inter_type", "inter_site")
_LINK_FIELDS = ("bandwidth_gbps", "latency_us")


@dataclass(frozen=True)
class Link:
    """Bandwidth in GB/s (math.inf: not limited) and one-way latency in microseconds."""
    bandwidth_gbps: float
    latency_us: float

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    def seconds(self, nbytes: float) -> float:
        """One message of `nbytes` alone on the link: latency plus serialisation."""
        return self.latency_s + nbytes / self.bytes_per_s

    def without_bandwidth(self) -> "Link":
        """The latency alone (where the kernel already shapes the bandwidth)."""
        return Link(math.inf, self.latency_us)

    def describe(self) -> str:
        bandwidth = "unlimited" if math.isinf(self.bandwidth_gbps) else f"{self.bandwidth_gbps:g} GB/s"
        return f"{bandwidth}, {self.latency_us:g} us"


def slowest(links: list[Link]) -> Link:
    """The smallest bandwidth and the largest latency among `links`."""
    return Link(min(link.bandwidth_gbps for link in links), max(link.latency_us for link in links))


@dataclass(frozen=True)
class LinkOverride:
    """One class's entry in a `links:` section: a field left out (None) keeps the default."""
    bandwidth_gbps: float | None = None
    latency_us: float | None = None

    def over(self, default: Link) -> Link:
        return Link(default.bandwidth_gbps if self.bandwidth_gbps is None else self.bandwidth_gbps,
                    default.latency_us if self.latency_us is None else self.latency_us)


@dataclass(frozen=True)
class LinkSection:
    """A cluster file's `links:` section: per-class overrides and per-site-pair links."""
    classes: tuple[tuple[str, LinkOverride], ...] = ()
    site_pairs: tuple[tuple[frozenset, LinkOverride], ...] = ()

    def override(self, link_class: str) -> LinkOverride:
        return dict(self.classes).get(link_class, LinkOverride())

    def site_pair(self, site_a: str | None, site_b: str | None) -> LinkOverride | None:
        return dict(self.site_pairs).get(frozenset((site_a, site_b)))


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _override_from_mapping(data, where: str, extra: tuple[str, ...] = ()) -> LinkOverride:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of bandwidth_gbps and latency_us, got {data!r}")
    unknown = sorted(set(data) - set(_LINK_FIELDS) - set(extra))
    if unknown:
        raise UserError(f"{where}: unknown field '{unknown[0]}' (known: {', '.join(_LINK_FIELDS + extra)})")
    values = {name: _number(data[name], f"{where}: field '{name}'") for name in _LINK_FIELDS if name in data}
    _check_link_values(where, **values)
    return LinkOverride(**values)


def _check_link_values(where: str, bandwidth_gbps: float | None = None, latency_us: float | None = None) -> None:
    """A bandwidth must be positive and finite, a latency finite and not negative; else a UserError
    naming `where` and the field."""
    if bandwidth_gbps is not None and not (bandwidth_gbps > 0 and math.isfinite(bandwidth_gbps)):
        raise UserError(f"{where}: field 'bandwidth_gbps' must be a positive number of GB/s, got {bandwidth_gbps}")
    if latency_us is not None and not (latency_us >= 0 and math.isfinite(latency_us)):
        raise UserError(f"{where}: field 'latency_us' must not be negative, got {latency_us}")


def links_from_mapping(data, source: str) -> LinkSection:
    """Parse a `links:` section; `source` is the cluster file."""
    where = f"{source}: links"
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of link classes ({', '.join(LINK_CLASSES)}), got {data!r}")
    known = LINK_CLASSES + ("site_pairs",)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown link class '{unknown[0]}' (known: {', '.join(known)})")
    classes = tuple((name, _override_from_mapping(data[name], f"{where}.{name}"))
                    for name in LINK_CLASSES if name in data)
    pairs_data = data.get("site_pairs", [])
    if not isinstance(pairs_data, list):
        raise UserError(f"{where}.site_pairs: expected a list of {{sites: [A, B], bandwidth_gbps, latency_us}}")
    pairs: dict[frozenset, LinkOverride] = {}
    for index, entry in enumerate(pairs_data):
        entry_where = f"{where}.site_pairs[{index}]"
        override = _override_from_mapping(entry, entry_where, extra=("sites",))
        pairs[name_pair(entry, "sites", entry_where, pairs)] = override
    return LinkSection(classes=classes, site_pairs=tuple(pairs.items()))


@dataclass(frozen=True)
class Location:
    """Where a rank sits: its chip type, the node (numbered per chip type) and the site."""
    chip: str
    node: int
    site: str | None = None
    host: str | None = None     # the cluster file's node that holds the chip, where it names nodes
    region: str | None = None   # that node's region

    def describe(self) -> str:
        if self.host is not None:
            return f"node {self.host} in region {self.region}"
        site = f" at site {self.site}" if self.site else ""
        return f"{self.chip} node {self.node}{site}"

    @property
    def machine(self):
        """What identifies the machine the rank runs on: the named node, else the whole location."""
        return self if self.host is None else (self.host, self.region)


def link_class(a: Location, b: Location) -> str:
    """The class of the link between two ranks' locations."""
    if a.host is not None and b.host is not None:
        if a.host == b.host:
            return "intra_node"
        return "inter_node" if a.region == b.region else "inter_site"
    if a.site != b.site:
        return "inter_site"
    if a.chip != b.chip:
        return "inter_type"
    if a.node != b.node:
        return "inter_node"
    return "intra_node"


def _default_link(link_class_name: str, chip_a: "ChipType", chip_b: "ChipType") -> Link:
    if link_class_name == "intra_node":
        return Link(chip_a.intra_node_gbps, chip_a.latency_us)
    if chip_a.name == chip_b.name:
        return Link(chip_a.inter_node_gbps, chip_a.latency_us)
    return Link(min(chip_a.inter_node_gbps, chip_b.inter_node_gbps), max(chip_a.latency_us, chip_b.latency_us))


def link_between(cluster: "ClusterSpec", a: Location, b: Location) -> tuple[str, Link]:
    """The class of the link joining two locations of `cluster`, and its bandwidth and latency."""
    name = link_class(a, b)
    if a.host is not None and b.host is not None:
        latency = max(cluster.chip(a.chip).latency_us, cluster.chip(b.chip).latency_us)
        return name, Link(cluster.graph.node_link_gbps(a.host, b.host), latency)
    default = _default_link(name, cluster.chip(a.chip), cluster.chip(b.chip))
    link = cluster.links.override(name).over(default)
    if name == "inter_site":
        pair = cluster.links.site_pair(a.site, b.site)
        if pair is not None:
            link = pair.over(link)
    return name, link


def rank_locations(strategy: "Strategy", cluster: "ClusterSpec", source: str = "strategy") -> list[Location]:
    """Each global rank's location (module doc: nodes fill in rank order, one contiguous block each;
    or the cluster file's named nodes)."""
    if cluster.placed is not None:
        return _placed_locations(strategy, cluster, source)
    locations: list[Location] = []
    next_node: dict[str, int] = {}   # per chip type: the first node no rank has used yet
    filled = 0                       # ranks on the current node
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


def stage_site(strategy: "Strategy", cluster: "ClusterSpec", index: int, source: str = "strategy") -> str | None:
    """The site stage `index` runs in (module doc); a site the cluster does not name is a UserError."""
    stage = strategy.stages[index]
    if stage.site is None:
        return cluster.chip(stage.chip).site
    if stage.site not in cluster.sites:
        known = ", ".join(sorted(cluster.sites)) or "none"
        raise UserError(f"{source}: field 'stages[{index}].site': unknown site '{stage.site}' "
                        f"(cluster {cluster.source} names: {known})")
    return stage.site


def _placed_locations(strategy: "Strategy", cluster: "ClusterSpec", source: str) -> list[Location]:
    """Each rank of chip type X on the next chip of type X in the cluster file's node order."""
    graph = cluster.graph
    node_index = {node.name: index for index, node in enumerate(graph.nodes)}
    free: dict[str, list] = {}
    for gpu in graph.gpus():
        free.setdefault(gpu.chip, []).append(gpu)
    locations = []
    for chip_name in strategy.rank_chips():
        cluster.chip(chip_name)
        if not free.get(chip_name):
            raise UserError(f"{source}: field 'stages': uses more chips of type '{chip_name}' than cluster "
                            f"{cluster.source} places on its nodes")
        gpu = free[chip_name].pop(0)
        locations.append(Location(chip_name, node_index[gpu.node], host=gpu.node, region=gpu.region))
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


class RankLinks:
    """The link from one rank to every other of a job: what its pacing layers apply per peer.

    With `kernel_shaped` the bandwidth between nodes is already enforced by the kernel (network
    namespaces with tc shaping), so only the latency is paced for peers on other nodes."""

    def __init__(self, cluster: "ClusterSpec", locations: list[Location], rank: int, kernel_shaped: bool = False):
        self.cluster, self.locations, self.rank = cluster, locations, rank
        self.kernel_shaped = kernel_shaped

    @classmethod
    def for_strategy(cls, strategy: "Strategy", cluster: "ClusterSpec", rank: int,
                     kernel_shaped: bool = False) -> "RankLinks":
        return cls(cluster, rank_locations(strategy, cluster), rank, kernel_shaped)

    def to(self, peer: int) -> Link:
        """What pacing applies to messages from this rank to global rank `peer`."""
        here, there = self.locations[self.rank], self.locations[peer]
        _, link = link_between(self.cluster, here, there)
        if self.kernel_shaped and here.machine != there.machine:
            return link.without_bandwidth()
        return link

    def class_to(self, peer: int) -> str:
        return link_class(self.locations[self.rank], self.locations[peer])


def stage_link(strategy: "Strategy", cluster: "ClusterSpec", locations: list[Location], src: int, dst: int) -> Link:
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
        used = sorted({link_between(links.cluster, links.locations[a], links.locations[b])
                       for a in ranks[src] for b in ranks[dst]},
                      key=lambda item: (LINK_CLASSES.index(item[0]), item[1].latency_us, -item[1].bandwidth_gbps))
        text = "; ".join(f"{name} {link.describe()}" for name, link in used)
        lines.append(f"link stage {src} -> {dst} ({label}emulated): {text}")
    return "\n".join(lines)
