"""Where a cluster file's chips sit, and the bandwidth and latency at each level: the `nodes`, `sites`
and `links` sections, validated on load.

One placement model: a chip sits on a node, a node in a site (a datacenter). Three levels of link,
each with a bandwidth in GB/s (10^9 bytes/s) and a one-way latency in microseconds:

    within a node            chips of one node (NVLink, HCCS, PCIe)
    between nodes of a site  one site's network
    between sites            cross-datacenter; a pair of sites may have its own link

A file places its chips in one of two ways.

Without a `nodes` section each chip type fills its own nodes of `chips_per_node` chips in the site its
`site:` field names (default: one unnamed site), and ranks take nodes in a strategy's rank order
(h2.core.links). Each level's link comes from the chip types' own fields unless the `links:` section
sets it for the whole cluster (either field may be left out), one class per level and one more for
nodes of two chip types in one site:

    intra_node   within a node         default: the chip's intra_node_gbps and latency_us
    inter_node   nodes of one type     default: the chip's inter_node_gbps and latency_us
    inter_type   nodes of two types    default: the slower inter_node_gbps, the larger latency_us
    inter_site   between sites         default: as inter_type (as inter_node between chips of one type)

    chips:
      - {name: A, site: north, ...}
      - {name: B, site: south, ...}
    sites: [north, south, west]         # sites stages may name besides their chip types' own
    links:
      inter_type: {bandwidth_gbps: 0.5, latency_us: 200}
      inter_site: {bandwidth_gbps: 0.1, latency_us: 20000}
      site_pairs:                       # one pair of sites' own link, over inter_site
        - {sites: [north, south], bandwidth_gbps: 0.05, latency_us: 30000}

With a `nodes` section the file places every chip on a named node in a named site, and the link of
each level is written on the node, the site and the site pair it belongs to (latency left out: the
larger latency_us of the two chips joined):

    nodes:                              # every chip of every type, on exactly one node
      - {name: a0, site: east, chips: {A100: 4, V100: 2}, bandwidth_gbps: 300}   # within the node
      - {name: b0, site: west, chips: {T4: 8}}           # default: the slowest intra_node_gbps
    sites:
      - {name: east, bandwidth_gbps: 6.25}              # between nodes of the site (default:
      - {name: west}                                     #   the slowest inter_node_gbps of its chips)
    links:
      site_pairs:                       # between the nodes of two sites (bandwidth required)
        - {sites: [east, west], bandwidth_gbps: 0.5}

Two sites without a pair have no direct link (traffic between them is routed through the slowest
pair); every site must be reached through pairs. The names of the placement are site, node,
bandwidth_gbps and latency_us everywhere; the old names (region, regions, region_links, link_gbps)
are refused in one line naming the new one.

A leaf: imports only h2.core.errors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from h2.core.errors import UserError

LINK_CLASSES = ("intra_node", "inter_node", "inter_type", "inter_site")
_LINK_FIELDS = ("bandwidth_gbps", "latency_us")
DEFAULT_SITE = "default"  # the site of a named node that names none
PLACEMENT_DOC = "one vocabulary for where chips sit: h2/core/placement.py, docs/heteroauto.md \"Cluster file\""


def refuse_renamed(entry: dict, source: str, prefix: str, renamed: dict[str, str]) -> None:
    """One line naming the file, the old field and the new one, for a placement key that was renamed."""
    for old, new in renamed.items():
        if old in entry:
            raise UserError(f"{source}: {prefix}{old}: renamed; use '{new}' ({PLACEMENT_DOC})")


# ---- links -----------------------------------------------------------------------------------------
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
    """One level's entry (a `links:` class, a site pair, a named node or site): a field left out (None)
    keeps the default."""
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


def _check_link_values(where: str, bandwidth_gbps: float | None = None, latency_us: float | None = None) -> None:
    """A bandwidth must be positive and finite, a latency finite and not negative; else a UserError
    naming `where` and the field."""
    if bandwidth_gbps is not None and not (bandwidth_gbps > 0 and math.isfinite(bandwidth_gbps)):
        raise UserError(f"{where}: field 'bandwidth_gbps' must be a positive number of GB/s, got {bandwidth_gbps}")
    if latency_us is not None and not (latency_us >= 0 and math.isfinite(latency_us)):
        raise UserError(f"{where}: field 'latency_us' must not be negative, got {latency_us}")


def _override_from_mapping(data, where: str, extra: tuple[str, ...] = ()) -> LinkOverride:
    """A mapping of bandwidth_gbps and latency_us (and the `extra` fields the caller reads)."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of bandwidth_gbps and latency_us, got {data!r}")
    unknown = sorted(set(data) - set(_LINK_FIELDS) - set(extra))
    if unknown:
        raise UserError(f"{where}: unknown field '{unknown[0]}' (known: {', '.join(_LINK_FIELDS + extra)})")
    values = {name: _number(data[name], f"{where}: field '{name}'") for name in _LINK_FIELDS if name in data}
    _check_link_values(where, **values)
    return LinkOverride(**values)


def name_pair(entry: dict, field: str, where: str, seen) -> frozenset:
    """The two different names an entry's `field` lists, as a key not in `seen`."""
    pair = entry.get(field)
    if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(name, str) and name
                                                                for name in pair) or pair[0] == pair[1]):
        raise UserError(f"{where}: field '{field}' must name two different {field}, got {pair!r}")
    key = frozenset(pair)
    if key in seen:
        raise UserError(f"{where}: field '{field}': the pair {pair[0]}/{pair[1]} is listed twice")
    return key


def links_from_mapping(data, source: str) -> LinkSection:
    """Parse a `links:` section; `source` is the cluster file."""
    where = f"{source}: links"
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of link classes ({', '.join(LINK_CLASSES)}), got {data!r}")
    known = LINK_CLASSES + ("site_pairs", )
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown link class '{unknown[0]}' (known: {', '.join(known)})")
    classes = tuple((name, _override_from_mapping(data[name], f"{where}.{name}")) for name in LINK_CLASSES
                    if name in data)
    pairs_data = data.get("site_pairs", [])
    if not isinstance(pairs_data, list):
        raise UserError(f"{where}.site_pairs: expected a list of {{sites: [A, B], bandwidth_gbps, latency_us}}")
    pairs: dict[frozenset, LinkOverride] = {}
    for index, entry in enumerate(pairs_data):
        entry_where = f"{where}.site_pairs[{index}]"
        if isinstance(entry, dict):
            refuse_renamed(entry, source, f"links.site_pairs[{index}].",
                           {"regions": "sites", "link_gbps": "bandwidth_gbps"})
        override = _override_from_mapping(entry, entry_where, extra=("sites", ))
        pairs[name_pair(entry, "sites", entry_where, pairs)] = override
    return LinkSection(classes=classes, site_pairs=tuple(pairs.items()))


# ---- sites -----------------------------------------------------------------------------------------
def sites_from_list(data, source: str) -> tuple[tuple[str, LinkOverride], ...]:
    """Parse a `sites:` list: each a site's name, or {name, bandwidth_gbps, latency_us} (the link
    between two nodes of the site, for a file with `nodes`)."""
    shape = "a list of site names or {name, bandwidth_gbps, latency_us}"
    if not isinstance(data, list):
        raise UserError(f"{source}: field 'sites' must be {shape}, got {data!r}")
    sites: dict[str, LinkOverride] = {}
    for index, entry in enumerate(data):
        where = f"{source}: sites[{index}]"
        if isinstance(entry, dict):
            refuse_renamed(entry, source, f"sites[{index}].", {"link_gbps": "bandwidth_gbps"})
            name, link = _name(entry, where), _override_from_mapping(entry, where, extra=("name", ))
        elif isinstance(entry, str) and entry:
            name, link = entry, LinkOverride()
        else:
            raise UserError(f"{source}: field 'sites' must be {shape}, got {data!r}")
        if name in sites:
            raise UserError(f"{source}: field 'sites' must list distinct site names, got {data!r}")
        sites[name] = link
    return tuple(sites.items())


# ---- nodes -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    name: str
    site: str
    chips: tuple[tuple[str, int], ...]  # (chip type, count) in file order
    bandwidth_gbps: float  # between two chips of this node
    latency_us: float | None = None  # None: the larger latency_us of the two chips


@dataclass(frozen=True)
class Gpu:
    """One chip of the cluster: its global index (nodes in file order, chips in node order)."""
    index: int
    chip: str
    node: str
    site: str


@dataclass(frozen=True)
class Placement:
    """Every chip on its node, every node in its site, and the link of each level (module doc)."""
    nodes: tuple[Node, ...]
    site_links: tuple[tuple[str, LinkOverride], ...]  # between nodes of the site; bandwidth set
    site_pairs: tuple[tuple[frozenset, LinkOverride], ...] = ()  # between two sites' nodes; bandwidth set

    def gpus(self) -> list[Gpu]:
        gpus: list[Gpu] = []
        for node in self.nodes:
            for chip, count in node.chips:
                for _ in range(count):
                    gpus.append(Gpu(len(gpus), chip, node.name, node.site))
        return gpus

    @property
    def site_names(self) -> list[str]:
        return [name for name, _ in self.site_links]

    @functools.cached_property
    def _by_name(self) -> tuple[dict[str, Node], dict[str, LinkOverride], dict[frozenset, LinkOverride]]:
        return {node.name: node for node in self.nodes}, dict(self.site_links), dict(self.site_pairs)

    def level_link(self, node_a: str, node_b: str) -> LinkOverride | None:
        """The link of the level joining chips on two nodes (None: two sites without a direct link)."""
        nodes, sites, pairs = self._by_name
        a, b = nodes[node_a], nodes[node_b]
        if a.name == b.name:
            return LinkOverride(a.bandwidth_gbps, a.latency_us)
        if a.site == b.site:
            return sites[a.site]
        return pairs.get(frozenset((a.site, b.site)))

    def bandwidth_gbps(self, a: Gpu, b: Gpu) -> float:
        """The bandwidth joining two chips (0.0: no direct link)."""
        link = self.level_link(a.node, b.node)
        return 0.0 if link is None else link.bandwidth_gbps

    def node_link(self, node_a: str, node_b: str, chip_latency_us: float) -> Link:
        """The link between chips on two nodes; between sites without a direct link, the slowest site
        pair (traffic is routed through others). A latency the file leaves out is `chip_latency_us`."""
        link = self.level_link(node_a, node_b)
        if link is None:
            pairs = [pair for _, pair in self.site_pairs]
            latencies = [pair.latency_us for pair in pairs if pair.latency_us is not None]
            link = LinkOverride(min(pair.bandwidth_gbps for pair in pairs), max(latencies) if latencies else None)
        return link.over(Link(math.inf, chip_latency_us))

    def edges(self) -> list[tuple[int, int, float]]:
        """Every pair of chips with a direct link: (index a, index b, GB/s), a < b."""
        gpus = self.gpus()
        return [(a.index, b.index, bandwidth) for i, a in enumerate(gpus) for b in gpus[i + 1:]
                if (bandwidth := self.bandwidth_gbps(a, b)) > 0]


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


_NODE_FIELDS = ("name", "site", "chips", "bandwidth_gbps", "latency_us")


def _node_from_mapping(entry, where: str, source: str, prefix: str, chips: dict[str, tuple[int, float, float]],
                       sites: dict[str, LinkOverride], listed: bool) -> Node:
    if isinstance(entry, dict):
        refuse_renamed(entry, source, prefix, {"region": "site", "link_gbps": "bandwidth_gbps"})
    entry = _mapping(entry, where, _NODE_FIELDS)
    name = _name(entry, where)
    site = entry.get("site", DEFAULT_SITE)
    if not isinstance(site, str) or not site:
        raise UserError(f"{where}: field 'site' must be a non-empty string, got {site!r}")
    if listed and site not in sites:
        raise UserError(f"{where}: field 'site': unknown site '{site}' (known: {', '.join(sites)})")
    counts = entry.get("chips")
    if not isinstance(counts, dict) or not counts:
        raise UserError(f"{where}: field 'chips' must map chip types to counts, got {counts!r}")
    for chip, count in counts.items():
        if chip not in chips:
            raise UserError(f"{where}: field 'chips': unknown chip type '{chip}' (known: {', '.join(chips)})")
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise UserError(f"{where}: field 'chips.{chip}' must be a positive count, got {count!r}")
    link = _override_from_mapping({field: entry[field] for field in _LINK_FIELDS if field in entry}, where)
    bandwidth = link.bandwidth_gbps if link.bandwidth_gbps is not None else min(chips[chip][1] for chip in counts)
    return Node(name, site, tuple(counts.items()), bandwidth, link.latency_us)


def placement_from_mapping(data: dict, chips: dict[str, tuple[int, float, float]],
                           sites: tuple[tuple[str, LinkOverride], ...], links: LinkSection, source: str) -> Placement:
    """Parse the `nodes` section of cluster file `source` with its sites and site pairs; `chips`: each
    chip type's (count, intra_node_gbps, inter_node_gbps). Chip counts per type over the nodes must
    equal the chip types' counts."""
    nodes_data = data.get("nodes")
    if not isinstance(nodes_data, list) or not nodes_data:
        raise UserError(f"{source}: field 'nodes' must be a non-empty list of {{name, site, chips}}")
    site_links, listed = dict(sites), bool(sites)
    nodes, placed, seen = [], {name: 0 for name in chips}, set()
    for index, entry in enumerate(nodes_data):
        node = _node_from_mapping(entry, f"{source}: nodes[{index}]", source, f"nodes[{index}].", chips, site_links,
                                  listed)
        if node.name in seen:
            raise UserError(f"{source}: nodes[{index}]: field 'name': node '{node.name}' listed twice")
        seen.add(node.name)
        site_links.setdefault(node.site, LinkOverride())
        for chip, count in node.chips:
            placed[chip] += count
        nodes.append(node)
    for chip, (count, _, _) in chips.items():
        if placed[chip] != count:
            raise UserError(f"{source}: field 'nodes': place {placed[chip]} chips of type '{chip}', "
                            f"its 'count' is {count}")
    resolved = tuple((site, _site_link(site, link, nodes, chips)) for site, link in site_links.items())
    placement = Placement(tuple(nodes), resolved, _placed_pairs(links, site_links, source))
    _check_connected(placement, source)
    return placement


def _site_link(site: str, link: LinkOverride, nodes: list[Node], chips: dict[str, tuple[int, float, float]]):
    """A site's link between its nodes, its bandwidth defaulting to the slowest inter_node_gbps of its chips."""
    if link.bandwidth_gbps is not None:
        return link
    members = {chip for node in nodes if node.site == site for chip, _ in node.chips}
    return LinkOverride(min((chips[chip][2] for chip in members), default=math.inf), link.latency_us)


def _placed_pairs(links: LinkSection, sites: dict[str, LinkOverride], source: str):
    """The site pairs of a file with nodes: both sites known, the bandwidth given."""
    for index, (pair, link) in enumerate(links.site_pairs):
        where = f"{source}: links.site_pairs[{index}]"
        for site in sorted(pair):
            if site not in sites:
                raise UserError(f"{where}: field 'sites': unknown site '{site}' (known: {', '.join(sites)})")
        if link.bandwidth_gbps is None:
            raise UserError(f"{where}: field 'bandwidth_gbps' is required where the file places chips on nodes")
    return links.site_pairs


def _check_connected(placement: Placement, source: str) -> None:
    """Sites must be joined through site pairs (nodes of one site always are)."""
    used = [s for s in placement.site_names if any(node.site == s for node in placement.nodes)]
    if not used:
        return
    reached, frontier = {used[0]}, [used[0]]
    while frontier:
        here = frontier.pop()
        for pair, _ in placement.site_pairs:
            if here in pair:
                for other in pair - {here}:
                    if other not in reached:
                        reached.add(other)
                        frontier.append(other)
    missing = [s for s in used if s not in reached]
    if missing:
        raise UserError(f"{source}: field 'links.site_pairs': the cluster graph is disconnected: no link reaches "
                        f"site '{missing[0]}' from site '{used[0]}'")


def default_placement(chips: list[tuple[str, int, int, float, float]]) -> Placement:
    """The placement of a cluster file without `nodes`: each chip type (name, count, chips_per_node,
    intra_node_gbps, inter_node_gbps) fills its own nodes, all in one site joined at the slowest
    inter_node_gbps."""
    nodes = []
    for name, count, per_node, intra, _ in chips:
        for number in range(-(-count // per_node)):
            nodes.append(
                Node(f"{name}-{number}", DEFAULT_SITE, ((name, min(per_node, count - number * per_node)), ), intra))
    return Placement(tuple(nodes), ((DEFAULT_SITE, LinkOverride(min(chip[4] for chip in chips))), ))
