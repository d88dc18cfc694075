"""Where each chip of a cluster sits, and the bandwidth between any two of them (Zorse's graph).

A cluster file may place its chips on named nodes, group nodes into regions and give bandwidths at
two levels; without these sections each chip type fills its own nodes of `chips_per_node` chips in
one region, as before:

    nodes:                                  # every chip of every type, on exactly one node
      - {name: a0, region: east, chips: {A100: 4, V100: 2}, link_gbps: 300}   # link_gbps: inside the node
      - {name: b0, region: west, chips: {T4: 8}}                           # default: slowest intra_node_gbps
    regions:                                # bandwidth between nodes of one region
      - {name: east, link_gbps: 6.25}                                      # default: slowest inter_node_gbps
      - {name: west}
    region_links:                           # bandwidth between nodes of two regions
      - {regions: [east, west], link_gbps: 0.5}

Two chips of one node are joined at the node's link_gbps, two chips on different nodes of one region
at the region's link_gbps, chips of different regions at their pair's link_gbps (no pair: no
direct link). The graph must be connected: a region no link reaches is refused in one line.
Bandwidths in GB/s (10^9 bytes/s).

Pure Python: imports only h2.core.errors; the cluster file (h2.core.cluster) parses through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from h2.core.errors import UserError

DEFAULT_REGION = "default"


@dataclass(frozen=True)
class Node:
    name: str
    region: str
    chips: tuple[tuple[str, int], ...]   # (chip type, count) in file order
    link_gbps: float                     # between two chips of this node


@dataclass(frozen=True)
class Gpu:
    """One chip of the cluster: its global index (nodes in file order, chips in node order)."""
    index: int
    chip: str
    node: str
    region: str


@dataclass(frozen=True)
class ClusterGraph:
    nodes: tuple[Node, ...]
    region_gbps: tuple[tuple[str, float], ...]                 # region -> bandwidth between its nodes
    region_links: tuple[tuple[frozenset, float], ...] = ()     # {region a, region b} -> bandwidth

    def gpus(self) -> list[Gpu]:
        gpus: list[Gpu] = []
        for node in self.nodes:
            for chip, count in node.chips:
                for _ in range(count):
                    gpus.append(Gpu(len(gpus), chip, node.name, node.region))
        return gpus

    @property
    def regions(self) -> list[str]:
        return [name for name, _ in self.region_gbps]

    def bandwidth_gbps(self, a: Gpu, b: Gpu) -> float:
        """The bandwidth joining two chips (0.0: no direct link)."""
        if a.node == b.node:
            return dict((node.name, node.link_gbps) for node in self.nodes)[a.node]
        if a.region == b.region:
            return dict(self.region_gbps)[a.region]
        return dict(self.region_links).get(frozenset((a.region, b.region)), 0.0)

    def node_link_gbps(self, node_a: str, node_b: str) -> float:
        """The bandwidth between chips on nodes `node_a` and `node_b`; between regions without a
        direct link, the slowest region link (traffic is routed through others)."""
        regions = {node.name: node.region for node in self.nodes}
        direct = self.bandwidth_gbps(Gpu(0, "", node_a, regions[node_a]), Gpu(1, "", node_b, regions[node_b]))
        return direct if direct > 0 else min(link for _, link in self.region_links)

    def edges(self) -> list[tuple[int, int, float]]:
        """Every pair of chips with a direct link: (index a, index b, GB/s), a < b."""
        gpus = self.gpus()
        return [(a.index, b.index, bandwidth) for i, a in enumerate(gpus) for b in gpus[i + 1:]
                if (bandwidth := self.bandwidth_gbps(a, b)) > 0]


def _positive(value, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: field '{name}' must be a number of GB/s, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise UserError(f"{where}: field '{name}' must be a positive number of GB/s, got {value}")
    return float(value)


def _mapping(entry, where: str, known: tuple[str, ...]) -> dict:
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected a mapping, got {entry!r}")
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown field '{unknown[0]}' (known: {', '.join(known)})")
    return entry


def _name(entry: dict, where: str, field: str = "name") -> str:
    name = entry.get(field)
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: field '{field}' must be a non-empty string, got {name!r}")
    return name


def graph_from_mapping(data: dict, chips: dict[str, tuple[int, float, float]], source: str) -> ClusterGraph:
    """Parse the `nodes`, `regions` and `region_links` sections of cluster file `source`; `chips`:
    each chip type's (count, intra_node_gbps, inter_node_gbps). Chip counts per type over the nodes
    must equal the chip types' counts."""
    nodes_data = data.get("nodes")
    if not isinstance(nodes_data, list) or not nodes_data:
        raise UserError(f"{source}: field 'nodes' must be a non-empty list of {{name, region, chips}}")
    regions_data = data.get("regions", [])
    if not isinstance(regions_data, list):
        raise UserError(f"{source}: field 'regions' must be a list of {{name, link_gbps}}")
    region_entries: dict[str, float | None] = {}
    for index, entry in enumerate(regions_data):
        where = f"{source}: regions[{index}]"
        entry = _mapping(entry, where, ("name", "link_gbps"))
        name = _name(entry, where)
        if name in region_entries:
            raise UserError(f"{where}: field 'name': region '{name}' listed twice")
        region_entries[name] = _positive(entry["link_gbps"], where, "link_gbps") if "link_gbps" in entry else None

    nodes, placed, seen = [], {name: 0 for name in chips}, set()
    for index, entry in enumerate(nodes_data):
        where = f"{source}: nodes[{index}]"
        entry = _mapping(entry, where, ("name", "region", "chips", "link_gbps"))
        name = _name(entry, where)
        if name in seen:
            raise UserError(f"{where}: field 'name': node '{name}' listed twice")
        seen.add(name)
        region = entry.get("region", DEFAULT_REGION)
        if not isinstance(region, str) or not region:
            raise UserError(f"{where}: field 'region' must be a non-empty string, got {region!r}")
        if regions_data and region not in region_entries:
            raise UserError(f"{where}: field 'region': unknown region '{region}' (known: {', '.join(region_entries)})")
        region_entries.setdefault(region, None)
        counts = entry.get("chips")
        if not isinstance(counts, dict) or not counts:
            raise UserError(f"{where}: field 'chips' must map chip types to counts, got {counts!r}")
        for chip, count in counts.items():
            if chip not in chips:
                raise UserError(f"{where}: field 'chips': unknown chip type '{chip}' (known: {', '.join(chips)})")
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                raise UserError(f"{where}: field 'chips.{chip}' must be a positive count, got {count!r}")
            placed[chip] += count
        link = (_positive(entry["link_gbps"], where, "link_gbps") if "link_gbps" in entry
                else min(chips[chip][1] for chip in counts))
        nodes.append(Node(name, region, tuple(counts.items()), link))
    for chip, (count, _, _) in chips.items():
        if placed[chip] != count:
            raise UserError(f"{source}: field 'nodes': place {placed[chip]} chips of type '{chip}', "
                            f"its 'count' is {count}")

    region_gbps = []
    for region, link in region_entries.items():
        if link is None:
            members = {chip for node in nodes if node.region == region for chip, _ in node.chips}
            link = min((chips[chip][2] for chip in members), default=math.inf)
        region_gbps.append((region, link))

    links_data = data.get("region_links", [])
    if not isinstance(links_data, list):
        raise UserError(f"{source}: field 'region_links' must be a list of {{regions: [A, B], link_gbps}}")
    pairs: dict[frozenset, float] = {}
    for index, entry in enumerate(links_data):
        where = f"{source}: region_links[{index}]"
        entry = _mapping(entry, where, ("regions", "link_gbps"))
        key = name_pair(entry, "regions", where, pairs)
        for region in entry["regions"]:
            if region not in region_entries:
                raise UserError(f"{where}: field 'regions': unknown region '{region}' "
                                f"(known: {', '.join(region_entries)})")
        if "link_gbps" not in entry:
            raise UserError(f"{where}: field 'link_gbps' is required")
        pairs[key] = _positive(entry["link_gbps"], where, "link_gbps")

    graph = ClusterGraph(tuple(nodes), tuple(region_gbps), tuple(pairs.items()))
    _check_connected(graph, source)
    return graph


def name_pair(entry: dict, field: str, where: str, seen) -> frozenset:
    """The two different names an entry's `field` lists (sites, regions), as a key not in `seen`."""
    pair = entry.get(field)
    if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(name, str) and name for name in pair)
            or pair[0] == pair[1]):
        raise UserError(f"{where}: field '{field}' must name two different {field}, got {pair!r}")
    key = frozenset(pair)
    if key in seen:
        raise UserError(f"{where}: field '{field}': the pair {pair[0]}/{pair[1]} is listed twice")
    return key


def _check_connected(graph: ClusterGraph, source: str) -> None:
    """Regions must be joined through region_links (nodes of one region always are)."""
    used = [r for r in graph.regions if any(node.region == r for node in graph.nodes)]
    if not used:
        return
    reached, frontier = {used[0]}, [used[0]]
    while frontier:
        here = frontier.pop()
        for pair, _ in graph.region_links:
            if here in pair:
                for other in pair - {here}:
                    if other not in reached:
                        reached.add(other)
                        frontier.append(other)
    missing = [r for r in used if r not in reached]
    if missing:
        raise UserError(f"{source}: field 'region_links': the cluster graph is disconnected: no link reaches "
                        f"region '{missing[0]}' from region '{used[0]}'")


def default_graph(chips: list[tuple[str, int, int, float, float]]) -> ClusterGraph:
    """The graph of a cluster file without `nodes`: each chip type (name, count, chips_per_node,
    intra_node_gbps, inter_node_gbps) fills its own nodes, all in one region joined at the slowest
    inter_node_gbps."""
    nodes = []
    for name, count, per_node, intra, _ in chips:
        for number in range(-(-count // per_node)):
            nodes.append(Node(f"{name}-{number}", DEFAULT_REGION,
                              ((name, min(per_node, count - number * per_node)),), intra))
    return ClusterGraph(tuple(nodes), ((DEFAULT_REGION, min(chip[4] for chip in chips)),))
