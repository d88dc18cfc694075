"""Zorse's additions to the shared formats: the cluster file's nodes, sites and the links of each level
(h2.core.placement), and the strategy file's mixed-type groups, uneven rows per replica,
ministages, optimizer sharding and offload (h2.core.strategy). Bad fields fail in one line."""

import subprocess
import sys

import pytest

from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.links import Link, placement_of, rank_locations
from h2.core.strategy import strategy_from_mapping

A100 = "{name: A100, count: 6, memory_gb: 40, chips_per_node: 4, tp_max: 4, intra_node_gbps: 300, inter_node_gbps: 25}"
T4 = "{name: T4, count: 2, memory_gb: 16, chips_per_node: 2, tp_max: 2, intra_node_gbps: 16, inter_node_gbps: 6.25}"
PLACED = """
nodes:
  - {name: a0, site: east, chips: {A100: 4}}
  - {name: a1, site: east, chips: {A100: 2, T4: 2}, bandwidth_gbps: 16}
sites:
  - {name: east, bandwidth_gbps: 6.25}
"""


def write_cluster(tmp_path, sections: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"chips: [{A100}, {T4}]\n{sections}")
    return str(path)


def test_chips_of_one_node_are_joined_at_the_nodes_link(tmp_path):
    placement = placement_of(load_cluster(write_cluster(tmp_path, PLACED)))
    a, b = placement.gpus()[4], placement.gpus()[6]  # node a1: an A100 and a T4
    assert placement.bandwidth_gbps(a, b) == 16


def test_chips_on_two_nodes_of_one_site_are_joined_at_the_sites_link(tmp_path):
    placement = placement_of(load_cluster(write_cluster(tmp_path, PLACED)))
    assert placement.bandwidth_gbps(placement.gpus()[0], placement.gpus()[7]) == 6.25


def test_a_node_without_its_own_link_takes_its_chips_intra_node_bandwidth(tmp_path):
    placement = placement_of(load_cluster(write_cluster(tmp_path, PLACED)))
    assert placement.bandwidth_gbps(placement.gpus()[0], placement.gpus()[1]) == 300


def test_chips_in_two_sites_are_joined_at_their_site_pairs_link(tmp_path):
    sections = """
nodes:
  - {name: a0, site: east, chips: {A100: 6}}
  - {name: t0, site: west, chips: {T4: 2}}
sites: [{name: east}, {name: west}]
links: {site_pairs: [{sites: [east, west], bandwidth_gbps: 0.5}]}
"""
    placement = placement_of(load_cluster(write_cluster(tmp_path, sections)))
    assert placement.bandwidth_gbps(placement.gpus()[0], placement.gpus()[6]) == 0.5


def test_a_cluster_file_without_nodes_fills_one_node_type_by_type(tmp_path):
    placement = placement_of(load_cluster(write_cluster(tmp_path, "")))
    assert [(node.name, node.chips)
            for node in placement.nodes] == [("A100-0", (("A100", 4), )), ("A100-1", (("A100", 2), )),
                                             ("T4-0", (("T4", 2), ))]


def test_edges_list_every_linked_pair_once(tmp_path):
    placement = placement_of(load_cluster(write_cluster(tmp_path, PLACED)))
    assert len(placement.edges()) == 8 * 7 // 2


@pytest.mark.parametrize("sections, error", [
    ("nodes:\n  - {name: a0, chips: {A100: 6, H100: 2}}\n", "nodes[0]: field 'chips': unknown chip type 'H100'"),
    ("nodes:\n  - {name: a0, chips: {A100: 6}}\n", "place 0 chips of type 'T4', its 'count' is 2"),
    ("nodes:\n  - {name: a0, chips: {A100: 6, T4: 2}, bandwidth_gbps: -3}\n",
     "nodes[0]: field 'bandwidth_gbps' must be a positive number of GB/s, got -3"),
    ("nodes:\n  - {name: a0, chips: {A100: 6, T4: 2}, cores: 3}\n", "nodes[0]: unknown field 'cores'"),
    ("nodes:\n  - {name: a0, site: east, chips: {A100: 6}}\n  - {name: t0, site: west, chips: {T4: 2}}\n",
     "the cluster graph is disconnected: no link reaches site 'west' from site 'east'"),
    ("nodes:\n  - {name: a0, site: east, chips: {A100: 6}}\n  - {name: t0, site: west, chips: {T4: 2}}\n"
     "links: {site_pairs: [{sites: [east, west], bandwidth_gbps: -1}]}\n",
     "links.site_pairs[0]: field 'bandwidth_gbps' must be a positive number of GB/s, got -1"),
    ("sites: [{name: east, bandwidth_gbps: 6.25}]\n", "sites[0]: field 'bandwidth_gbps' needs a 'nodes' section"),
])
def test_a_bad_node_or_site_is_refused_naming_the_field(tmp_path, sections, error):
    with pytest.raises(UserError, match=None) as caught:
        load_cluster(write_cluster(tmp_path, sections))
    assert error in str(caught.value) and "\n" not in str(caught.value)


def test_a_disconnected_cluster_file_exits_2_with_one_line(tmp_path):
    path = write_cluster(
        tmp_path, "nodes:\n  - {name: a0, site: east, chips: {A100: 6}}\n"
        "  - {name: t0, site: west, chips: {T4: 2}}\n")
    result = subprocess.run([sys.executable, "-m", "h2.cli.heteroauto", "search", "--cluster", path],
                            capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "disconnected" in result.stderr


@pytest.mark.parametrize("sections, old, new", [
    ("regions: [{name: east}]\n", "regions", "sites"),
    ("region_links: [{regions: [east, west], link_gbps: 0.5}]\n", "region_links", "links.site_pairs"),
    ("nodes:\n  - {name: a0, region: east, chips: {A100: 6, T4: 2}}\n", "nodes[0].region", "site"),
    ("nodes:\n  - {name: a0, chips: {A100: 6, T4: 2}, link_gbps: 16}\n", "nodes[0].link_gbps", "bandwidth_gbps"),
    ("nodes:\n  - {name: a0, chips: {A100: 6, T4: 2}}\nsites: [{name: default, link_gbps: 6.25}]\n",
     "sites[0].link_gbps", "bandwidth_gbps"),
    ("links: {site_pairs: [{regions: [east, west], bandwidth_gbps: 0.5}]}\n", "links.site_pairs[0].regions", "sites"),
    ("links: {site_pairs: [{sites: [east, west], link_gbps: 0.5}]}\n", "links.site_pairs[0].link_gbps",
     "bandwidth_gbps"),
])
def test_an_old_placement_key_is_refused_in_one_line_naming_the_new_one(tmp_path, sections, old, new):
    path = write_cluster(tmp_path, sections)
    with pytest.raises(UserError) as caught:
        load_cluster(path)
    assert str(caught.value).startswith(f"{path}: {old}: renamed; use '{new}' (") and "\n" not in str(caught.value)


def test_a_chip_types_old_region_key_is_refused_naming_site(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("chips:\n  - {name: A100, count: 1, memory_gb: 40, chips_per_node: 1, tp_max: 1, "
                    "intra_node_gbps: 300, inter_node_gbps: 25, region: east}\n")
    with pytest.raises(UserError, match=r"cluster.yaml: chips\[0\].region: renamed; use 'site' \("):
        load_cluster(str(path))


def test_a_chip_types_site_beside_named_nodes_is_refused(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(f"chips: [{A100[:-1]}, site: east}}, {T4}]\nnodes:\n  - {{name: a0, chips: {{A100: 6, T4: 2}}}}\n")
    with pytest.raises(UserError, match=r"chips\[0\]: field 'site': the 'nodes' section places the chips"):
        load_cluster(str(path))


LEVELS = """
nodes:
  - {name: a0, site: east, chips: {A100: 4}, latency_us: 2}
  - {name: a1, site: east, chips: {A100: 2}}
  - {name: t0, site: west, chips: {T4: 2}}
sites:
  - {name: east, bandwidth_gbps: 6.25, latency_us: 40}
  - {name: west}
links:
  site_pairs: [{sites: [east, west], bandwidth_gbps: 0.5, latency_us: 30000}]
"""


def test_each_level_of_the_placement_gives_its_bandwidth_and_latency_to_the_ranks_it_joins(tmp_path):
    from h2.core.links import RankLinks
    cluster = load_cluster(write_cluster(tmp_path, LEVELS))
    strategy = strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": "tiny", "stages": [{
                "chip": "A100", "tp": 2, "layers": 1
            }, {"chip": "A100", "tp": 4, "layers": 1}, {"chip": "T4", "tp": 2, "layers": 2}]
        }, "s.yaml")
    links = RankLinks.for_strategy(strategy, cluster, rank=0)  # ranks 0-3 on a0, 4-5 on a1, 6-7 on t0
    assert (links.class_to(1), links.to(1)) == ("intra_node", Link(300, 2))
    assert (links.class_to(4), links.to(4)) == ("inter_node", Link(6.25, 40))
    assert (links.class_to(6), links.to(6)) == ("inter_site", Link(0.5, 30000))


def test_a_latency_the_placement_leaves_out_is_the_larger_of_the_two_chips(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, PLACED))
    placement = placement_of(cluster)
    assert placement.node_link("a0", "a1", 10.0) == Link(6.25, 10.0)


# ---- the strategy file ---------------------------------------------------------------------------
def zorse_strategy(**changes):
    stage = {"chips": ["T4", "A100"], "rows": [1, 3], "layers": 4, "tp": 1}
    data = {
        "dp": 2, "micro_batches": 4, "micro_batch_size": 2, "model": "tiny", "ministages": 2,
        "optimizer_sharding": "zero2", "offload": ["activations", "parameters"], "stages": [stage]
    }
    stage.update(changes.pop("stage", {}))
    data.update(changes)
    return strategy_from_mapping(data, "s.yaml")


def test_a_mixed_type_group_gives_each_replica_its_chip_and_rows():
    strategy = zorse_strategy()
    assert strategy.rank_chips() == ["T4", "A100"] and strategy.stage_rows(0) == [1, 3]


def test_a_mixed_type_group_counts_chips_per_type():
    assert zorse_strategy().chips_per_type() == {"T4": 1, "A100": 1}


def test_a_stage_without_rows_splits_a_micro_batch_evenly():
    strategy = zorse_strategy(stage={"rows": None})
    assert strategy.stage_rows(0) == [2, 2]


def test_the_zorse_fields_survive_a_save_and_load(tmp_path):
    from h2.core.strategy import load_strategy
    strategy = zorse_strategy()
    strategy.save(tmp_path / "s.yaml")
    again = load_strategy(tmp_path / "s.yaml")
    assert again == strategy


def test_a_mixed_group_places_each_rank_on_its_own_chip_types_nodes(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, ""))
    assert [location.chip for location in rank_locations(zorse_strategy(), cluster)] == ["T4", "A100"]


@pytest.mark.parametrize("changes, error", [
    ({"stage": {"rows": [1, 2]}}, "field 'stages[0].rows' sum to 3, a micro-batch has dp * micro_batch_size = 4"),
    ({"stage": {"rows": [4]}}, "field 'stages[0].rows' lists 1 replicas, the stage has 2"),
    ({"stage": {"rows": [0, 4]}}, "field 'stages[0].rows' must be positive for every replica"),
    ({"stage": {"tp": 2}}, "field 'stages[0].tp': a mixed-type group (chips) runs tp 1, got 2"),
    ({"stage": {"dp": 3}}, "field 'stages[0].dp' (3) differs from the 2 replicas its 'chips' lists"),
    ({"stage": {"chip": "A100"}}, "field 'stages[0].chip' (A100) must be the first of its 'chips' (T4)"),
    ({"stage": {"layers": 1}, "model": {"preset": "tiny", "num_layers": 1}
      }, "field 'stages[0].layers': 1 layers cannot be cut into ministages = 2 chunks of at least one layer"),
    ({"ministages": 0}, "field 'ministages' must be positive, got 0"),
    ({"optimizer_sharding": "zero3"}, "field 'optimizer_sharding'"),
    ({"offload": ["gradients"]}, "field 'offload'"),
    ({"offload": ["activations", "activations"]}, "field 'offload' lists an entry twice"),
])
def test_a_bad_zorse_strategy_field_is_refused_naming_it(changes, error):
    with pytest.raises(UserError) as caught:
        zorse_strategy(**changes)
    assert error in str(caught.value) and "\n" not in str(caught.value)


def two_stages_of_two_ministages(layers_a: int, layers_b: int):
    return strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "ministages": 2, "model": {
                "preset": "tiny", "num_layers": layers_a + layers_b
            }, "stages": [{"chip": "A", "tp": 1, "layers": layers_a}, {"chip": "B", "tp": 1, "layers": layers_b}]
        }, "s.yaml")


def test_ministage_chunks_go_round_robin_over_the_stages():
    strategy = two_stages_of_two_ministages(4, 4)
    assert strategy.chunk_layers(0) == [range(0, 2), range(4, 6)]
    assert strategy.chunk_layers(1) == [range(2, 4), range(6, 8)]


def test_a_stage_whose_layers_the_ministages_do_not_divide_takes_the_larger_chunks_first():
    strategy = two_stages_of_two_ministages(5, 3)
    assert strategy.chunk_layers(0) == [range(0, 3), range(5, 7)]
    assert strategy.chunk_layers(1) == [range(3, 5), range(7, 8)]


# ---- the ministage schedule ----------------------------------------------------------------------
def test_gpipe_ministages_run_every_forward_of_a_chunk_before_the_next_and_step_after_each_backward():
    from h2.core.schedule import gpipe_ministages
    (actions, ) = gpipe_ministages(1, 2, 2)
    assert " ".join(map(str, actions)) == "F0/0 F1/0 F0/1 F1/1 B0/1 B1/1 STEP/1 B0/0 B1/0 STEP/0"


def test_gpipe_ministages_send_the_last_stages_chunk_to_the_first_stages_next_chunk():
    from h2.core.schedule import gpipe_ministages
    first, last = gpipe_ministages(2, 1, 2)
    assert [str(a) for a in first[:4]] == ["F0/0", "SEND_F0/0", "RECV_F0/1", "F0/1"]
    assert [str(a) for a in last[:4]] == ["RECV_F0/0", "F0/0", "SEND_F0/0", "RECV_F0/1"]


def test_the_gpipe_schedule_is_one_ministage_of_gpipe_ministages():
    from h2.core.schedule import gpipe_ministages, schedule_actions
    assert schedule_actions("gpipe", 2, 3) == gpipe_ministages(2, 3, 1)


# ---- ranks on the cluster file's nodes -----------------------------------------------------------
def test_each_rank_takes_the_next_chip_of_its_type_in_the_files_node_order(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, PLACED))  # a0: 4 A100; a1: 2 A100 and 2 T4
    strategy = zorse_strategy(stage={"chips": ["T4", "A100"]})
    assert [location.node_name for location in rank_locations(strategy, cluster)] == ["a1", "a0"]


def test_two_ranks_on_one_named_node_are_one_emulated_machine_joined_at_the_nodes_link(tmp_path):
    from h2.core.links import RankLinks, nodes_of
    sections = ("nodes:\n  - {name: n0, chips: {A100: 1, T4: 1}, bandwidth_gbps: 16}\n"
                "  - {name: n1, chips: {A100: 5, T4: 1}}\n")
    cluster = load_cluster(write_cluster(tmp_path, sections))
    strategy = zorse_strategy(stage={"chips": ["A100", "T4"]})
    links = RankLinks.for_strategy(strategy, cluster, rank=0)
    assert links.class_to(1) == "intra_node" and links.to(1).bandwidth_gbps == 16
    assert len(nodes_of(links.locations)) == 1
