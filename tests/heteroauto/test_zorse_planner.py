"""The Zorse planner (heteroauto/zorse): phase 1 (SPLIT min-k-cut), the models, phase 2 on the
seed's clusters A, B, C, its strategies in the shared simulator, and its commands."""

import dataclasses
import json
import os
import random
import re

import networkx as nx
import pytest

from autohelpers import CLUSTERS
from h2.cli.heteroauto import main
from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.links import Link
from h2.core.model_config import resolve_model
from h2.core.schedule import gpipe_ministages
from h2.core.strategy import load_strategy
from heteroauto.profiles import profiles_for
from heteroauto.simulator import simulate
from heteroauto.stage_terms import StageTerms
from heteroauto.zorse.costs import ChipRates, GroupShape, Shapes, rank_memory, rows_per_rank
from heteroauto.zorse.partition import cut_weight, split_bound, split_partitions
from heteroauto.zorse.planner import plan, rates_from_profiles
from heteroauto.zorse.scoring import simulate_plan

ROOT = os.path.dirname(CLUSTERS)


def zorse(name: str, model: str, memory_fraction: float = 1.0):
    cluster = load_cluster(os.path.join(CLUSTERS, f"zorse-{name}.yaml"))
    shape = resolve_model(os.path.join(ROOT, "models", f"llama-{model}.yaml"))
    training = dataclasses.replace(cluster.training, micro_batch_size=1)
    rates = rates_from_profiles(cluster, profiles_for(cluster, shape, training, []), memory_fraction)
    return cluster, shape, training, rates


def best_plan(name: str, model: str, memory_fraction: float = 1.0):
    cluster, shape, training, rates = zorse(name, model, memory_fraction)
    return plan(cluster, shape, training, rates).best


# ---- phase 1 -------------------------------------------------------------------------------------
def brute_force_min_cuts(graph: nx.Graph) -> dict[int, float]:
    """The optimal k-cut weight for every k, over every set partition (restricted growth strings)."""
    vertices = list(graph.nodes())
    index = {v: i for i, v in enumerate(vertices)}
    edges = [(index[u], index[v], w) for u, v, w in graph.edges(data="weight")]
    best: dict[int, float] = {}
    labels = [0] * len(vertices)

    def grow(i: int, used: int) -> None:
        if i == len(vertices):
            weight = sum(w for a, b, w in edges if labels[a] != labels[b])
            best[used] = min(best.get(used, float("inf")), weight)
            return
        for label in range(used + 1):
            labels[i] = label
            grow(i + 1, max(used, label + 1))

    grow(1, 1)
    return best


def random_connected_graph(rng: random.Random, n: int) -> nx.Graph:
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    for v in range(1, n):  # a random spanning tree, then random extra edges
        graph.add_edge(v, rng.randrange(v), weight=rng.randint(1, 20))
    for u in range(n):
        for v in range(u + 1, n):
            if not graph.has_edge(u, v) and rng.random() < 0.4:
                graph.add_edge(u, v, weight=rng.randint(1, 20))
    return graph


@pytest.mark.parametrize("seed", range(12))
def test_split_cuts_are_within_the_split_bound_of_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    graph = random_connected_graph(rng, rng.randint(2, 10 if seed < 2 else 8))
    optimum = brute_force_min_cuts(graph)
    for partition in split_partitions(graph):
        assert partition.cut_weight == pytest.approx(cut_weight(graph, partition.groups))
        assert partition.cut_weight <= split_bound(partition.k) * optimum[partition.k] + 1e-9


def test_split_gives_every_k_in_one_pass_each_partition_refining_the_last():
    partitions = split_partitions(random_connected_graph(random.Random(7), 9))
    assert [p.k for p in partitions] == list(range(1, 10))
    for coarse, fine in zip(partitions, partitions[1:]):
        assert all(any(set(group) <= set(parent) for parent in coarse.groups) for group in fine.groups)


def test_a_disconnected_graph_is_refused_in_one_line():
    graph = nx.Graph()
    graph.add_edge(0, 1, weight=1.0)
    graph.add_edge(2, 3, weight=1.0)
    with pytest.raises(UserError, match=r"^g: not connected: no link joins \[0, 1\] to \[2, 3\]") as error:
        split_partitions(graph, "g")
    assert "\n" not in str(error.value)


# ---- the models ----------------------------------------------------------------------------------
def test_rows_per_rank_are_in_proportion_to_speed():
    slow, fast = ChipRates("slow", 3.0, 6.0, 3.0, 1e9, 1.0), ChipRates("fast", 1.0, 2.0, 1.0, 1e9, 1.0)
    assert rows_per_rank([slow, fast], 4) == (1, 3)


def test_gpipe_ministages_replay_on_one_group_is_every_pass_plus_every_step():
    terms = [StageTerms(forward_s=1.0, backward_s=2.0, weight_grad_s=0.0, update_s=0.5)] * 3
    result = simulate(gpipe_ministages(1, 4, 3), terms)
    assert result.iteration_s == pytest.approx(3 * 4 * (1.0 + 2.0) + 3 * 0.5)


# A group of 4 ranks holding ministages of 2 and 1 layers, 1000 parameters a layer, 4-byte gradients,
# no embedding or head, no activations: the memory model's gradient and weight terms alone.
FOUR_RANKS = GroupShape((ChipRates("x", 1.0, 2.0, 1.0, 1e9, 1.0), ) * 4, (1, 1, 1, 1), Link(1.0, 0.0))
GRADIENTS_ONLY = Shapes(layer_params=1000, embedding_params=0, head_params=0, weight_bytes=0, gradient_bytes=4,
                        optimizer_bytes=0, checkpoint_bytes=0, layer_activation_bytes=0, boundary_bytes=0, num_layers=3)


def gradient_bytes(grad_clip: float, overlap: bool) -> float:
    return rank_memory(FOUR_RANKS, 0, (2, 1), 1, False, False, False, GRADIENTS_ONLY, grad_clip=grad_clip,
                       overlap=overlap).device_bytes


def test_heteropp_runtime_with_clipping_counts_the_held_reduced_shards_beside_the_ministage_in_backward():
    # ministage 1 (1 layer) steps first and its owned quarter waits; ministage 0's 2 layers are whole
    assert gradient_bytes(1.0, overlap=False) == 2 * 4000 + 1 * 4000 / 4


def test_heteropp_runtime_without_clipping_holds_only_the_ministage_in_backward():
    assert gradient_bytes(0.0, overlap=False) == 2 * 4000


def test_zorse_runtime_with_clipping_holds_every_ministage_shard_and_one_whole_layer():
    assert gradient_bytes(1.0, overlap=True) == 4000 + 3 * 4000 / 4


def test_zorse_runtime_without_clipping_holds_the_stepping_ministage_shards_and_one_whole_layer():
    assert gradient_bytes(0.0, overlap=True) == 4000 + 2 * 4000 / 4


def test_heteropp_runtime_without_offload_keeps_every_layer_weights_whole():
    weights_only = dataclasses.replace(GRADIENTS_ONLY, weight_bytes=2, gradient_bytes=0)
    three_ministages = (1, 1, 1)
    heteropp = rank_memory(FOUR_RANKS, 0, three_ministages, 1, False, False, False, weights_only, overlap=False)
    zorse_runtime = rank_memory(FOUR_RANKS, 0, three_ministages, 1, False, False, False, weights_only)
    assert (heteropp.device_bytes, zorse_runtime.device_bytes) == (3 * 2000, 2 * 2000 + 2000 / 4)


def test_search_zorse_finds_no_single_group_of_local_hetero_without_offload_on_the_heteropp_runtime(capsys):
    # the group's weights alone (8 layers of 2.9 MB, replicated by HeteroPP's runtime) exceed emu-fast's 27 MB
    code, out, err = run(capsys, "search", "--planner", "zorse", "--cluster", os.path.join(
        CLUSTERS, "local-hetero.yaml"), "--no-overlap", "--offload", "off", "--max-groups", "1",
                         "--lone-group-ministages")
    assert code == 2 and "rank 0 (emu-fast) of group 0 needs 0.0385 GB, its memory allows 0.027 GB" in err


def test_search_zorse_refuses_a_negative_grad_clip_in_one_line_with_exit_2(capsys):
    code, out, err = run(capsys, "search", "--planner", "zorse", "--cluster", os.path.join(CLUSTERS, "zorse-a.yaml"),
                         "--grad-clip", "-1")
    assert code == 2 and err.strip() == ("heteroauto: error: --grad-clip: must be a finite number at least 0 "
                                         "(0: no clipping), got -1.0")


# ---- phase 2 on the seed's clusters --------------------------------------------------------------
def test_cluster_c_keeps_every_data_parallel_group_inside_one_region():
    best = best_plan("c", "13b")
    assert len(best.groups) > 1
    assert all(len(group.regions) == 1 for group in best.groups)


def test_with_lone_group_ministages_cluster_b_gives_each_group_no_fewer_ministages_as_the_model_grows():
    per_group = []
    for size in ("7b", "13b", "33b"):
        cluster, shape, training, rates = zorse("b", size)
        per_group.append(plan(cluster, shape, training, rates, lone_group_ministages=True).best.ministages)
    assert per_group == sorted(per_group) and per_group[0] < per_group[-1]


def test_cluster_b_gives_each_group_more_ministages_as_the_model_grows():
    per_group = []
    for size in ("7b", "13b", "33b"):
        cluster, shape, training, rates = zorse("b", size)
        per_group.append(plan(cluster, shape, training, rates).best.ministages)
    assert per_group[0] < per_group[1] < per_group[2]


def test_a_group_over_its_memory_gives_layers_to_the_group_with_room():
    # split by speed alone, the H100 node's rank of A 65B needs 131 GB of 84.6 (no plan at all)
    best = best_plan("a", "65b")
    assert best.max_memory_fraction <= 1 and len({group.layers for group in best.groups}) > 1


def test_layers_move_for_memory_only_when_no_split_by_speed_fits():
    # B 33B fits with the split by speed (19, 8, 7, 7, 7, 4, 4, 4 layers); with layers moved in every
    # candidate the planner picked a moved split instead
    best = best_plan("b", "33b")
    assert [group.layers for group in best.groups] == [19, 8, 7, 7, 7, 4, 4, 4]


def test_the_lone_group_rule_gives_a_plan_of_one_group_one_ministage():
    cluster, shape, training, rates = zorse("a", "13b")  # without the rule: 4 ministages
    best = plan(cluster, shape, training, rates, max_groups=1).best
    assert (len(best.groups), best.ministages) == (1, 1)


def test_more_ministages_leave_each_group_the_layers_of_its_speed_share():
    cluster, shape, training, rates = zorse("b", "13b")  # 8 one-VM groups: a T4 VM's share is 2 of 40 layers
    # at 8 sequences per micro-batch every group holds its speed share (no layer moves for memory)
    layers = {
        k: [
            g.layers for g in plan(cluster, shape, training, rates, ministages=k, min_groups=8,
                                   micro_batch_sequences=8).best.groups
        ] for k in (1, 2)
    }
    assert layers[2] == layers[1]


def test_min_groups_2_leaves_out_the_plan_of_one_group_of_all_machines():
    cluster, shape, training, rates = zorse("b", "7b")
    assert len(plan(cluster, shape, training, rates, lone_group_ministages=True).best.groups) == 1
    assert len(plan(cluster, shape, training, rates, lone_group_ministages=True, min_groups=2).best.groups) >= 2


@pytest.mark.parametrize("name, size", [("a", "33b"), ("b", "13b"), ("c", "7b")])
def test_every_rank_of_a_plan_fits_the_memory_model(name, size):
    best = best_plan(name, size)
    assert all(memory.device_bytes <= memory.capacity_bytes for group in best.groups for memory in group.memory)


def test_at_70_percent_memory_the_plan_takes_more_ministages():
    # A 7B: 1 ministage at 100%, more at 70% (A 33B at 70% moves layers between groups instead)
    full, tight = best_plan("a", "7b"), best_plan("a", "7b", memory_fraction=0.7)
    assert tight.ministages > full.ministages
    assert tight.max_memory_fraction <= 1


def test_at_70_percent_memory_a_model_that_cannot_fit_fails_naming_the_constraint():
    with pytest.raises(
            UserError, match=r"zorse-a.yaml: no plan fits the memory model; nearest: .* of group \d+ "
            r"needs [\d.]+ GB, its memory allows [\d.]+ GB$") as error:
        best_plan("a", "65b", memory_fraction=0.7)
    assert "\n" not in str(error.value)


def test_the_latency_model_predicts_the_simulated_step_within_ten_percent():
    cluster, shape, training, rates = zorse("c", "7b")
    best = plan(cluster, shape, training, rates).best
    simulated = simulate_plan(best, rates, shape, training).iteration_s
    assert best.latency.iteration_s == pytest.approx(simulated, rel=0.1)


# ---- commands ------------------------------------------------------------------------------------
def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_partition_prints_the_regions_as_the_two_groups(capsys):
    code, out, err = run(capsys, "partition", "--cluster", os.path.join(CLUSTERS, "zorse-c.yaml"), "--json")
    assert code == 0, err
    two = json.loads(out)["partitions"][1]
    assert [group["regions"] for group in two["groups"]] == [["east"], ["west"]]


def test_search_zorse_writes_a_strategy_that_simulate_scores_with_the_same_simulator(capsys, tmp_path):
    path = str(tmp_path / "zorse.yaml")
    code, out, err = run(capsys, "search", "--planner", "zorse", "--cluster", os.path.join(CLUSTERS, "zorse-a.yaml"),
                         "--model", os.path.join(ROOT, "models", "llama-7b.yaml"), "--out", path, "--json")
    assert code == 0, err
    searched = json.loads(out)
    strategy = load_strategy(path)
    assert strategy.optimizer_sharding == "zero2" and strategy.ministages == searched["ministages"]
    code, out, err = run(capsys, "simulate", "--strategy", path, "--cluster", os.path.join(CLUSTERS, "zorse-a.yaml"),
                         "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_s"] == pytest.approx(searched["simulated_iteration_s"])


CLUSTER_HEAD = ("name: bad\nchips:\n  - {name: x, count: 2, memory_gb: 16, chips_per_node: 1, tp_max: 1,"
                " intra_node_gbps: 10, inter_node_gbps: 1, peak_tflops: 10}\n")


@pytest.mark.parametrize("body, error", [
    pytest.param("nodes:\n  - {name: n0, site: r0, chips: {x: 1}}\n  - {name: n1, site: r1, chips: {x: 1}}\n",
                 r"bad.yaml: field 'links.site_pairs': the cluster graph is disconnected", id="disconnected_graph"),
    pytest.param("nodes:\n  - {name: n0, chips: {y: 2}}\n",
                 r"bad.yaml: nodes\[0\]: field 'chips': unknown chip type 'y'", id="unknown_chip"),
    pytest.param(
        "nodes:\n  - {name: n0, site: r0, chips: {x: 1}}\n  - {name: n1, site: r1, chips: {x: 1}}\n"
        "links:\n  site_pairs:\n    - {sites: [r0, r1], bandwidth_gbps: -1}\n",
        r"bad.yaml: links.site_pairs\[0\]: field 'bandwidth_gbps' must be a positive", id="negative_bandwidth"),
])
def test_partition_refuses_a_bad_cluster_in_one_line_with_exit_2(capsys, write, body, error):
    path = write("bad.yaml", CLUSTER_HEAD + body)
    code, out, err = run(capsys, "partition", "--cluster", path)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert re.search(error, err)


def test_search_zorse_refuses_a_model_larger_than_all_memory_in_one_line_with_exit_2(capsys):
    code, out, err = run(capsys, "search", "--planner", "zorse", "--cluster", os.path.join(CLUSTERS, "zorse-b.yaml"),
                         "--model", os.path.join(ROOT, "models", "llama-65b.yaml"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "no plan fits the memory model; nearest:" in err


def test_search_zorse_refuses_min_groups_above_max_groups_in_one_line_with_exit_2(capsys):
    code, out, err = run(capsys, "search", "--planner", "zorse", "--cluster", os.path.join(CLUSTERS,
                                                                                           "zorse-b.yaml"), "--model",
                         os.path.join(ROOT, "models", "llama-7b.yaml"), "--min-groups", "3", "--max-groups", "2")
    assert code == 2 and err.strip(
    ) == "heteroauto: error: --min-groups: must be at least 1 and at most --max-groups, got 3"


def test_max_groups_one_plans_a_single_data_parallel_group():
    cluster, shape, training, rates = zorse("c", "7b")
    assert len(plan(cluster, shape, training, rates, max_groups=1, lone_group_ministages=True).best.groups) == 1


def test_without_overlap_the_zero2_traffic_adds_to_the_compute():
    cluster, shape, training, rates = zorse("a", "7b")
    overlapped = plan(cluster, shape, training, rates, max_groups=1, ministages=1, offload="off").best
    serial = plan(cluster, shape, training, rates, max_groups=1, ministages=1, offload="off", overlap=False).best
    assert serial.latency.iteration_s > overlapped.latency.iteration_s


def test_simulate_traces_every_ministage_of_a_zorse_strategy(capsys, tmp_path):
    trace = tmp_path / "predicted.json"
    code, out, err = run(capsys, "simulate", "--strategy", os.path.join(ROOT, "strategies", "local-zorse-group.yaml"),
                         "--cluster", os.path.join(CLUSTERS, "local-zorse.yaml"), "--trace", str(trace))
    assert code == 0, err
    data = json.loads(trace.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    strategy = load_strategy(os.path.join(ROOT, "strategies", "local-zorse-group.yaml"))
    forwards = {e["name"].split("/")[1] for e in events if e.get("name", "").startswith("F")}
    assert forwards == {str(chunk) for chunk in range(strategy.ministages)}
