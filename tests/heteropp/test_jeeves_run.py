"""JEEVES on the runtime: a pipeline running explicit per-stage orders trains exactly like the
single-device trainer, `h2 train --schedule jeeves --cluster` generates the orders from the cluster's
sites, links and memory, and bad input is one line, exit 2, before any rank starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from h2.core.cluster import load_cluster
from h2.core.strategy import load_strategy
from heteroauto.jeeves_plan import with_schedule_orders
from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO_ROOT, "configs/clusters/local-2site.yaml")
STRATEGY = os.path.join(REPO_ROOT, "configs/strategies/local-2site-pp2.yaml")


@pytest.mark.slow
def test_a_pipeline_running_all_forwards_first_orders_matches_the_single_device_trainer_over_20_steps():
    data = {
        "dp": 1, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 32, "model": "tiny", "schedule": "jeeves",
        "orders": ["F0 F1 F2 F3 B0 B1 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"], "stages": [{
            "chip": "emu-north", "tp": 1, "layers": 2
        }, {"chip": "emu-south", "tp": 1, "layers": 2}]
    }
    records, ranks = run_pipeline(data, 20)
    assert [rank["compute_order"] for rank in sorted(ranks, key=lambda r: r["stage"])] == data["orders"]
    assert max_relative_loss_difference(records, run_reference(data, 20)) < 1e-5


def test_jeeves_on_the_two_site_cluster_runs_ahead_on_the_first_stage_where_1f1b_waits_for_the_far_site():
    strategy, _ = with_schedule_orders(load_strategy(STRATEGY), load_cluster(CLUSTER), "jeeves", STRATEGY)
    # 20 ms each way dwarfs a micro-batch's compute, and the chip holds all 8 in flight: stage 0
    # sends every forward before the first gradient can be back (1F1B holds at most 2).
    assert strategy.orders[0] == "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7"


def test_a_strategy_in_flight_limit_bounds_how_far_the_first_stage_runs_ahead():
    strategy = load_strategy(STRATEGY)
    strategy.in_flight_limit = 3
    strategy, _ = with_schedule_orders(strategy, load_cluster(CLUSTER), "jeeves", STRATEGY)
    assert strategy.orders[0].startswith("F0 F1 F2 B0 F3 B1 F4")


def h2_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "h2", "train", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)


def write_yaml(path, data) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def edited(path: str, edit) -> dict:
    with open(path) as handle:
        data = yaml.safe_load(handle)
    edit(data)
    return data


@pytest.mark.parametrize("case, expected", [
    ("negative latency", "cluster.yaml: links.inter_site: field 'latency_us' must not be negative, got -1.0"),
    ("negative bandwidth", "cluster.yaml: links.inter_site: field 'bandwidth_gbps' must be a positive number of "
     "GB/s, got -0.01"),
    ("k below one", "strategy.yaml: field 'in_flight_limit' must be at least 1 (one micro-batch), got 0"),
    ("unknown site", "strategy.yaml: field 'stages[1].site': unknown site 'east' (cluster"),
    ("memory below one micro-batch", "strategy.yaml: field 'stages[0]': chip 'emu-north' holds 0.0009 GB, one "
     "micro-batch in flight over its 2 layers needs"),
])
def test_bad_jeeves_input_is_one_line_exit_2_before_any_rank_starts(tmp_path, case, expected):
    cluster = edited(CLUSTER, lambda c: None)
    strategy = edited(STRATEGY, lambda s: None)
    if case == "negative latency":
        cluster["links"]["inter_site"]["latency_us"] = -1
    elif case == "negative bandwidth":
        cluster["links"]["inter_site"]["bandwidth_gbps"] = -0.01
    elif case == "k below one":
        strategy["in_flight_limit"] = 0
    elif case == "unknown site":
        strategy["stages"][1]["site"] = "east"
    else:
        cluster["chips"][0]["memory_gb"] = 0.001
    result = h2_train("--strategy", write_yaml(tmp_path / "strategy.yaml", strategy), "--cluster",
                      write_yaml(tmp_path / "cluster.yaml", cluster), "--schedule", "jeeves", "--steps", "1", "--out",
                      str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "stage 0:" not in result.stdout


def test_jeeves_without_a_cluster_or_orders_is_one_line_exit_2(tmp_path):
    result = h2_train("--strategy", STRATEGY, "--schedule", "jeeves", "--steps", "1", "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "schedule 'jeeves' is generated from the cluster's costs" in result.stderr


def heteroauto_simulate(strategy: str) -> dict:
    import json

    result = subprocess.run([
        sys.executable, "-m", "h2.cli.heteroauto", "simulate", "--strategy", strategy, "--cluster", CLUSTER, "--json"
    ], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_heteroauto_simulate_prices_the_boundary_between_sites_at_the_inter_site_link():
    (first, _) = heteroauto_simulate(STRATEGY)["stages"]
    assert first["send_s"] == pytest.approx(0.020 + 32768 / 0.01e9)  # 20 ms latency + 32 KiB at 10 MB/s


def test_heteroauto_simulate_replays_a_jeeves_strategy_faster_than_its_1f1b_on_the_two_sites(tmp_path):
    jeeves = write_yaml(tmp_path / "jeeves.yaml", edited(STRATEGY, lambda s: s.update(schedule="jeeves")))
    assert heteroauto_simulate(jeeves)["iteration_s"] < 0.75 * heteroauto_simulate(STRATEGY)["iteration_s"]
