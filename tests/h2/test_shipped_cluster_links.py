"""Every shipped cluster file gives the links recorded before the placement vocabulary became one
(site, bandwidth_gbps, latency_us; h2.core.placement): the link between every kind of rank pair
(h2.core.links, what the pacing layers and the network namespaces apply), between stages and inside a
node (the cost model and the simulator), and between the Zorse planner's machines. The recording
(shipped_cluster_links.json) was taken with the old keys on the code before the change."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from h2.core.cluster import ClusterSpec, load_cluster
from h2.core.links import Location, link_between, placement_of
from heteroauto.profiles import intra_node_link
from heteroauto.stage_terms import link_between_stages
from heteroauto.zorse.graph import link_of, machines_of

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped_cluster_links.json")
SHIPPED = sorted(
    os.path.relpath(os.path.join(folder, name), REPO_ROOT)
    for folder in (os.path.join(REPO_ROOT, "configs", "clusters"), )
    for name in os.listdir(folder) if name.endswith(".yaml")) + ["benchmarks/metis/cluster.yaml"]
MOST_MACHINES = 16  # the Zorse planner's machine pairs are recorded for clusters up to this many machines


def placed_rank_links(cluster: ClusterSpec) -> dict[str, list]:
    """A rank on every (node, chip type) of the file's nodes against every other."""
    placement = placement_of(cluster)
    index = {node.name: number for number, node in enumerate(placement.nodes)}
    ranks = list({(gpu.node, gpu.chip): gpu for gpu in placement.gpus()}.values())
    table = {}
    for a, b in itertools.combinations_with_replacement(ranks, 2):
        name, link = link_between(cluster, Location(a.chip, index[a.node], a.site, node_name=a.node),
                                  Location(b.chip, index[b.node], b.site, node_name=b.node))
        table[f"rank {a.node}/{a.chip}|{b.node}/{b.chip}"] = [name, link.bandwidth_gbps, link.latency_us]
    return table


def filled_rank_links(cluster: ClusterSpec) -> dict[str, list]:
    """Ranks of every two chip types, on one node or two, in every site a stage may sit in."""
    table = {}
    for chip_a, chip_b in itertools.product(cluster.chips, cluster.chips):
        for site_a, site_b in itertools.product([chip_a.site, *cluster.sites], [chip_b.site, *cluster.sites]):
            for node_a, node_b in ((0, 0), (0, 1)):
                name, link = link_between(cluster, Location(chip_a.name, node_a, site_a),
                                          Location(chip_b.name, node_b, site_b))
                key = f"rank {chip_a.name}@{site_a}#{node_a}|{chip_b.name}@{site_b}#{node_b}"
                table[key] = [name, link.bandwidth_gbps, link.latency_us]
    return table


def link_table(path: str) -> dict[str, list]:
    cluster = load_cluster(os.path.join(REPO_ROOT, path))
    table = placed_rank_links(cluster) if cluster.placed is not None else filled_rank_links(cluster)
    for chip_a, chip_b in itertools.product(cluster.chips, cluster.chips):
        link = link_between_stages(cluster, chip_a, chip_b)
        table[f"stage {chip_a.name}|{chip_b.name}"] = [link.bandwidth_gbps, link.latency_us]
    for chip in cluster.chips:
        link = intra_node_link(cluster, chip)
        table[f"intra {chip.name}"] = [link.bandwidth_gbps, link.latency_us]
    machines = machines_of(cluster)
    if len(machines) <= MOST_MACHINES:
        for a, b in itertools.combinations_with_replacement(machines, 2):
            link = link_of(cluster, a, b)
            table[f"zorse {a.name}|{b.name}"] = [link.bandwidth_gbps, link.latency_us]
        table["machines"] = [[m.name, m.region, list(m.chips), m.bandwidth_gbps] for m in machines]
    return table


def test_the_recording_covers_every_shipped_cluster_file():
    with open(RECORDED, encoding="utf-8") as handle:
        assert sorted(json.load(handle)) == sorted(SHIPPED)


@pytest.mark.parametrize("path", SHIPPED)
def test_a_shipped_cluster_gives_the_recorded_links_between_every_kind_of_rank_pair(path):
    with open(RECORDED, encoding="utf-8") as handle:
        recorded = json.load(handle)[path]
    assert link_table(path) == recorded
