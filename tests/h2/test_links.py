"""Link classes (h2.core.links): the arrival rule, which class joins two ranks, the cluster file's
`links:` section and its bad fields."""

import math

import pytest

from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.links import (
    ArrivalClock,
    Link,
    Location,
    RankLinks,
    link_between,
    link_class,
    nodes_of,
    rank_locations,
    stage_link,
)
from h2.core.strategy import strategy_from_mapping

FAST = ("{name: F, count: 8, memory_gb: 1, chips_per_node: 4, tp_max: 4, intra_node_gbps: 100, inter_node_gbps: 10, "
        "latency_us: 5}")
SLOW = ("{name: S, count: 4, memory_gb: 1, chips_per_node: 2, tp_max: 2, intra_node_gbps: 20, inter_node_gbps: 2, "
        "latency_us: 30}")


@pytest.fixture
def cluster_file(tmp_path):

    def write(links: str = "") -> str:
        path = tmp_path / "c.yaml"
        path.write_text(f"chips: [{FAST}, {SLOW}]\n" + (f"links:\n{links}" if links else ""))
        return str(path)

    return write


def strategy(*stages):
    """Stages as (chip, tp, dp) on the tiny model (its 4 layers split over the stages)."""
    layers = [4 // len(stages)] * len(stages)
    return strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 2, "micro_batch_size": 12, "model": "tiny",
            "stages": [{"chip": chip, "tp": tp, "dp": dp, "layers": n} for (chip, tp, dp), n in zip(stages, layers)]
        }, "s.yaml")


# ---- the arrival rule ----------------------------------------------------------------------------
def test_a_message_on_an_idle_link_arrives_after_latency_plus_bytes_over_bandwidth():
    clock = ArrivalClock(Link(bandwidth_gbps=1.0, latency_us=20))
    assert clock.arrival(now=10.0, nbytes=1_000_000) == pytest.approx(10.0 + 20e-6 + 1e-3)


def test_messages_posted_together_queue_behind_each_other_for_their_bytes_only():
    clock = ArrivalClock(Link(bandwidth_gbps=0.1, latency_us=1000))
    first = clock.arrival(now=0.0, nbytes=100_000)
    second = clock.arrival(now=0.0, nbytes=100_000)
    assert second - first == pytest.approx(1e-3)  # one latency for the burst, not one per message


def test_a_message_posted_after_the_link_went_idle_pays_the_latency_again():
    clock = ArrivalClock(Link(bandwidth_gbps=1.0, latency_us=500))
    clock.arrival(now=0.0, nbytes=1000)
    assert clock.arrival(now=1.0, nbytes=0) == pytest.approx(1.0 + 500e-6)


def test_an_unlimited_bandwidth_adds_the_latency_alone():
    clock = ArrivalClock(Link(bandwidth_gbps=10.0, latency_us=50).without_bandwidth())
    assert clock.arrival(now=2.0, nbytes=10**12) == pytest.approx(2.0 + 50e-6)


# ---- which class joins two ranks -----------------------------------------------------------------
@pytest.mark.parametrize("a, b, expected", [
    (Location("F", 0), Location("F", 0), "intra_node"),
    (Location("F", 0), Location("F", 1), "inter_node"),
    (Location("F", 0), Location("S", 0), "inter_type"),
    (Location("F", 0, "north"), Location("F", 0, "south"), "inter_site"),
])
def test_link_class_of_two_locations(a, b, expected):
    assert link_class(a, b) == expected


def test_without_a_links_section_the_chips_own_fields_are_the_link_classes(cluster_file):
    cluster = load_cluster(cluster_file())
    assert link_between(cluster, Location("S", 0), Location("S", 0)) == ("intra_node", Link(20, 30))
    assert link_between(cluster, Location("F", 0), Location("F", 1)) == ("inter_node", Link(10, 5))
    assert link_between(cluster, Location("F", 0), Location("S", 1)) == ("inter_type", Link(2, 30))


def test_the_links_section_overrides_a_class_and_a_left_out_field_keeps_its_default(cluster_file):
    cluster = load_cluster(cluster_file("  inter_type: {bandwidth_gbps: 0.5}\n"))
    assert link_between(cluster, Location("F", 0), Location("S", 0))[1] == Link(0.5, 30)


def test_a_site_pair_overrides_the_inter_site_class(cluster_file):
    cluster = load_cluster(
        cluster_file("  inter_site: {bandwidth_gbps: 0.1, latency_us: 20000}\n"
                     "  site_pairs:\n"
                     "    - {sites: [north, south], latency_us: 30000}\n"))
    assert link_between(cluster, Location("F", 0, "south"), Location("F", 0, "north"))[1] == Link(0.1, 30000)
    assert link_between(cluster, Location("F", 0, "south"), Location("F", 0, "east"))[1] == Link(0.1, 20000)


# ---- where ranks sit -----------------------------------------------------------------------------
def test_ranks_fill_each_chip_types_nodes_in_rank_order(cluster_file):
    cluster = load_cluster(cluster_file())
    locations = rank_locations(strategy(("F", 2, 3), ("S", 2, 1)), cluster)
    assert [(node.describe(), ranks) for node, ranks in nodes_of(locations)] == [("F node 0", [0, 1, 2, 3]),
                                                                                 ("F node 1", [4, 5]),
                                                                                 ("S node 0", [6, 7])]


def test_a_chip_type_that_comes_back_after_another_starts_a_fresh_node(cluster_file):
    cluster = load_cluster(cluster_file())
    three = strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": {"preset": "tiny", "num_layers": 3},
            "stages": [{"chip": "F", "tp": 1, "layers": 1}, {"chip": "S", "tp": 1, "layers": 1},
                       {"chip": "F", "tp": 1, "layers": 1}]
        }, "s.yaml")
    assert rank_locations(three, cluster) == [Location("F", 0), Location("S", 0), Location("F", 1)]


def test_more_nodes_than_the_cluster_has_is_refused_naming_the_chip_type(cluster_file):
    cluster = load_cluster(cluster_file())
    with pytest.raises(UserError, match="s.yaml: field 'stages': places chip type 'S' on 3 nodes"):
        rank_locations(strategy(("F", 1, 1), ("S", 2, 3)), cluster, "s.yaml")


def test_rank_links_pace_only_the_latency_between_kernel_shaped_nodes(cluster_file):
    cluster = load_cluster(cluster_file())
    links = RankLinks.for_strategy(strategy(("F", 2, 1), ("S", 2, 1)), cluster, rank=0, kernel_shaped=True)
    assert (links.to(1), links.to(2)) == (Link(100, 5), Link(math.inf, 30))


def test_the_planners_stage_link_is_the_slowest_class_between_the_two_stages(cluster_file):
    cluster = load_cluster(cluster_file("  inter_type: {bandwidth_gbps: 0.5, latency_us: 200}\n"))
    plan = strategy(("F", 4, 2), ("S", 2, 1))
    assert stage_link(plan, cluster, rank_locations(plan, cluster), 0, 1) == Link(0.5, 200)


def test_stage_links_name_the_wrap_around_from_the_last_stage_to_stage_0_under_ministages(cluster_file):
    import dataclasses

    from h2.core.links import describe_stage_links
    cluster = load_cluster(cluster_file("  inter_type: {bandwidth_gbps: 0.5, latency_us: 200}\n"))
    plan = dataclasses.replace(strategy(("F", 1, 1), ("S", 1, 1)), ministages=2)
    lines = describe_stage_links(plan, RankLinks.for_strategy(plan, cluster, rank=0)).splitlines()
    assert lines[-1] == "link stage 1 -> 0 (wrap-around, emulated): inter_type 0.5 GB/s, 200 us"


# ---- bad link fields -----------------------------------------------------------------------------
@pytest.mark.parametrize("links, error", [
    pytest.param("  inter_node: {bandwidth_gbps: -1, latency_us: 5}\n",
                 r"c.yaml: links.inter_node: field 'bandwidth_gbps' must be a positive number of GB/s, got -1",
                 id="negative_bandwidth"),
    pytest.param("  intra_node: {bandwidth_gbps: 0}\n", r"links.intra_node: field 'bandwidth_gbps' must be a positive",
                 id="zero_bandwidth"),
    pytest.param("  inter_type: {latency_us: -3}\n", r"links.inter_type: field 'latency_us' must not be negative",
                 id="negative_latency"),
    pytest.param("  inter_site: {bandwidth_gbps: .inf}\n", r"links.inter_site: field 'bandwidth_gbps'",
                 id="infinite_bandwidth"),
    pytest.param("  inter_rack: {bandwidth_gbps: 1}\n", r"links: unknown link class 'inter_rack'", id="unknown_class"),
    pytest.param("  inter_node: {bandwidth: 1}\n", r"links.inter_node: unknown field 'bandwidth'", id="unknown_field"),
    pytest.param("  inter_node: {bandwidth_gbps: fast}\n",
                 r"links.inter_node: field 'bandwidth_gbps': expected a number", id="not_a_number"),
    pytest.param("  site_pairs: [{sites: [north, north], latency_us: 1}]\n",
                 r"links.site_pairs\[0\]: field 'sites' must name two different sites", id="site_pair_of_one_site"),
    pytest.param("  site_pairs: [{sites: [a, b], latency_us: -1}]\n",
                 r"links.site_pairs\[0\]: field 'latency_us' must not be negative", id="site_pair_negative_latency"),
])
def test_a_bad_link_field_is_one_error_naming_file_and_field(cluster_file, links, error):
    with pytest.raises(UserError, match=error):
        load_cluster(cluster_file(links))


@pytest.mark.parametrize("old, new, error", [
    pytest.param("latency_us: 5", "latency_us: -5", "field 'latency_us' must not be negative", id="negative_latency"),
    pytest.param("inter_node_gbps: 10", "inter_node_gbps: -10", "field 'inter_node_gbps' must be positive",
                 id="negative_inter_node_bandwidth"),
    pytest.param("intra_node_gbps: 100", "intra_node_gbps: 0", "field 'intra_node_gbps' must be positive",
                 id="zero_intra_node_bandwidth"),
])
def test_a_bad_chip_link_field_is_refused_naming_the_chip(tmp_path, old, new, error):
    path = tmp_path / "c.yaml"
    path.write_text(f"chips: [{FAST.replace(old, new)}]\n")
    with pytest.raises(UserError, match=f"c.yaml: chip 'F': {error}"):
        load_cluster(str(path))
