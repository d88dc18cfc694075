"""Infinite, NaN, huge and zero inputs: one line naming what is wrong, exit 2, and never a hang."""

import json
import math
import os
import time

import pytest

from autohelpers import CLUSTERS
from h2.cli.heteroauto import main
from h2.core.model_config import preset

CHIP = ("{name: X, count: 8, memory_gb: 80, chips_per_node: 8, tp_max: 8, intra_node_gbps: 100, "
        "inter_node_gbps: 10, latency_us: 10, peak_tflops: 300}")
TRAINING = "training: {seq_len: 4096, global_batch_sequences: 64}\n"
LOCAL = os.path.join(CLUSTERS, "local-emulated.yaml")


def cluster_text(chip_field: str = "", training: str = TRAINING) -> str:
    """The cluster with one chip field set to `chip_field` ("name: value")."""
    fields = dict(item.split(": ") for item in CHIP.strip("{}").split(", "))
    if chip_field:
        name, value = chip_field.split(": ")
        fields[name] = value
    return "chips: [{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}]\n" + training


def run_quickly(capsys, *argv):
    code, captured = run_timed(capsys, *argv)
    return code, captured.err


def run_timed(capsys, *argv):
    """The exit code and captured output of `heteroauto *argv`, which must take under 20 s of CPU."""
    started = time.process_time()
    code = main(list(argv))
    took = time.process_time() - started
    captured = capsys.readouterr()
    assert took < 20, f"took {took:.1f} s CPU"
    return code, captured


def assert_one_line_exit_2(code, err, *fragments):
    assert code == 2, err
    assert err.startswith("heteroauto: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize("field, fragment", [
    pytest.param("memory_gb: .inf", "field 'memory_gb': expected a finite number", id="infinite_memory"),
    pytest.param("memory_gb: .nan", "field 'memory_gb': expected a finite number", id="nan_memory"),
    pytest.param("memory_gb: 1.0e+300", "field 'memory_gb' must be between", id="huge_memory"),
    pytest.param("memory_gb: 0", "field 'memory_gb' must be positive", id="zero_memory"),
    pytest.param("count: 1099511627776", "field 'count' must be between", id="2_to_the_40_chips"),
    pytest.param("count: 0", "field 'count' must be positive", id="zero_chips"),
    pytest.param("inter_node_gbps: 0", "field 'inter_node_gbps' must be positive", id="zero_bandwidth"),
    pytest.param("inter_node_gbps: .inf", "field 'inter_node_gbps': expected a finite number", id="infinite_bandwidth"),
    pytest.param("latency_us: .nan", "field 'latency_us': expected a finite number", id="nan_latency"),
    pytest.param("peak_tflops: 1.0e+308", "field 'peak_tflops' must be between", id="huge_peak"),
    pytest.param("chips_per_node: 4294967296", "field 'chips_per_node' must be between", id="huge_node"),
])
def test_a_bad_chip_number_is_one_line_and_exit_2(capsys, write, field, fragment):
    path = write("c.yaml", cluster_text(field))
    code, err = run_quickly(capsys, "search", "--cluster", path, "--model", "h2-100b")
    assert_one_line_exit_2(code, err, "c.yaml", fragment)


@pytest.mark.parametrize("training, fragment", [
    pytest.param("training: {seq_len: 4096, global_batch_sequences: 1000000000000000000000000000000}\n",
                 "field 'global_batch_sequences': must be between", id="huge_batch"),
    pytest.param("training: {seq_len: 4096, global_batch_sequences: 0}\n",
                 "field 'global_batch_sequences': must be between", id="zero_batch"),
    pytest.param("training: {seq_len: 0, global_batch_sequences: 8}\n", "field 'seq_len' must be positive",
                 id="zero_sequence"),
    pytest.param("training: {seq_len: 1073741824, global_batch_sequences: 8}\n", "field 'seq_len' must be between",
                 id="huge_sequence"),
    pytest.param("training: {seq_len: 4096, global_batch_sequences: 8, alpha: .nan}\n", "field 'alpha'",
                 id="nan_alpha"),
    pytest.param("training: {seq_len: 4096, global_batch_tokens: 99999999999999999999999999999999999999999M}\n",
                 "field 'global_batch_tokens'", id="overflowing_token_count"),
])
def test_a_bad_training_number_is_one_line_and_exit_2(capsys, write, training, fragment):
    path = write("c.yaml", cluster_text(training=training))
    code, err = run_quickly(capsys, "search", "--cluster", path, "--model", "h2-100b")
    assert_one_line_exit_2(code, err, fragment)


@pytest.mark.parametrize("flags, fragment", [
    (["--time-limit", "nan"], "--time-limit"),
    (["--time-limit", "inf"], "--time-limit"),
    (["--time-limit", "0"], "--time-limit"),
    (["--gap", "nan"], "--gap"),
    (["--gap", "1"], "--gap"),
    (["--top", "0"], "--top"),
    (["--top", "1000000000"], "--top"),
    (["--group-size", "-1"], "--group-size"),
    (["--group-size", "1099511627776"], "--group-size"),
    (["--dp", "0"], "--dp 0"),
    (["--gbs-tokens", "9" * 40], "--gbs-tokens"),
    (["--alpha", "nan"], "field 'alpha'"),
    (["--seq-len", "0"], "field 'seq_len'"),
])
def test_a_bad_flag_is_one_line_and_exit_2(capsys, flags, fragment):
    code, err = run_quickly(capsys, "search", "--cluster", LOCAL, "--no-baselines", *flags)
    assert_one_line_exit_2(code, err, fragment)


def test_an_infinite_profile_time_is_one_line_and_exit_2(capsys, tmp_path):
    profile = tmp_path / "p.yaml"
    code, _ = run_quickly(capsys, "profile", "--cluster", LOCAL, "--chip", "emu-big", "--synthesise", "--out",
                          str(profile))
    assert code == 0
    profile.write_text(profile.read_text().replace("forward_s: ", "forward_s: .inf #", 1))
    code, err = run_quickly(capsys, "search", "--cluster", LOCAL, "--profile", str(profile), "--no-baselines")
    assert_one_line_exit_2(code, err, "p.yaml", "forward_s': expected a finite number")


def test_a_strategy_with_more_micro_batches_than_a_replay_takes_is_refused(capsys, write):
    path = write(
        "s.yaml", "dp: 1\nmicro_batches: 1099511627776\nmicro_batch_size: 1\nmodel: tiny\n"
        "stages: [{chip: emu-big, tp: 1, layers: 4}]\n")
    code, err = run_quickly(capsys, "simulate", "--cluster", LOCAL, "--strategy", path)
    assert_one_line_exit_2(code, err, "s.yaml", "micro_batches")


def test_a_prime_global_batch_of_a_billion_sequences_is_planned_at_once(capsys, write):
    path = write("c.yaml", cluster_text(training="training: {seq_len: 256, global_batch_sequences: 1000000007}\n"))
    code, captured = run_timed(capsys, "search", "--cluster", path, "--model", "small", "--no-baselines", "--json")
    assert code == 0, captured.err
    result = json.loads(captured.out)
    strategy = result["strategy"]
    assert strategy["dp"] * strategy["micro_batches"] * strategy["micro_batch_size"] == 1000000007
    assert sum(stage["layers"] for stage in strategy["stages"]) == preset("small").num_layers
    assert result["optimal"] and math.isfinite(result["iteration_s"]) and result["iteration_s"] > 0


def test_a_model_deeper_than_the_planner_takes_is_refused(capsys, write):
    model = write("m.yaml", "preset: tiny\nnum_layers: 4096\n")
    code, err = run_quickly(capsys, "search", "--cluster", LOCAL, "--model", model, "--no-baselines")
    assert_one_line_exit_2(code, err, "num_layers", "at most 1024")
