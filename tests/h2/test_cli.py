"""The `h2` command as a user runs it: results on stdout, one-line errors with exit code 2."""

import json

import pytest

from h2.train.metrics import read_metrics


def test_train_tiny_200_steps_lowers_loss_by_at_least_30_percent(cli, tmp_path):
    result = cli("h2", "train", "--preset", "tiny", "--steps", "200", "--device", "cpu", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    losses = [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert len(losses) == 200
    assert losses[-1] <= 0.7 * sum(losses[:10]) / 10
    assert "loss" in result.stdout and "200/200" in result.stderr


def test_model_info_100b_prints_the_parameter_count(cli):
    result = cli("h2", "model-info", "--preset", "h2-100b", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["parameters"] == 102_986_424_320
    assert info["flops_per_token"]["layer_backward"] == 2 * info["flops_per_token"]["layer_forward"]


@pytest.mark.parametrize("args, message", [
    (["train", "--preset", "huge"], "unknown model preset 'huge'"),
    (["train", "--steps", "0"], "'steps' out of range"),
    (["train", "--steps", "x"], "invalid int value"),
    (["train", "--preset", "h2-100b"], "planning only"),
    (["train", "--out", "/proc/no/such/dir"], "is not writable"),
    (["train", "--device", "quantum"], "unknown device 'quantum'"),
    (["train", "--device", "cuda"], "not available on this machine"),
    (["model-info", "--tp", "0"], "--tp must be at least 1"),
    (["model-info", "--tp", "3"], "--tp: tp 3 does not divide the model's num_heads (4)"),
    (["train", "--seed", "-1"], "'seed' out of range: -1"),
    (["train", "--seed", str(2**64)], "'seed' out of range"),
    (["train", "--micro-batch-size", "1000000000"], "lower --micro-batch-size or --seq-len"),
    (["train", "--strategy", "configs/strategies/local-cpu-dipu.yaml", "--seq-len", "100000"
      ], "--seq-len 100000 differs from configs/strategies/local-cpu-dipu.yaml's seq_len"),
    (["train", "--strategy", "configs/strategies/local-tiny-pp2.yaml", "--nproc", "0"
      ], "--nproc must be at least 1, got 0"),
    (["train", "--strategy", "configs/strategies/local-tiny-pp2.yaml", "--steps", "0"], "'steps' out of range: 0"),
])
def test_bad_input_is_one_line_and_exit_code_2(cli, tmp_path, args, message):
    if args[0] == "train" and "--out" not in args:
        args = [*args, "--out", str(tmp_path / "run")]
    result = cli("h2", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_malformed_model_yaml_names_the_file(cli, tmp_path):
    bad = tmp_path / "model.yaml"
    bad.write_text("preset: tiny\nhidden_size: big\n")
    result = cli("h2", "train", "--model-config", str(bad), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert f"{bad}: field 'hidden_size': expected an integer" in result.stderr


def test_a_model_too_large_to_allocate_is_refused_naming_the_file_and_field(cli, tmp_path):
    huge = tmp_path / "model.yaml"
    huge.write_text("preset: tiny\nhidden_size: 100000000\n")
    result = cli("h2", "train", "--model-config", str(huge), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert f"{huge}: model: field 'hidden_size' must be at most 1048576, got 100000000" in result.stderr


def test_resume_without_a_checkpoint_is_a_clear_error(cli, tmp_path):
    result = cli("h2", "train", "--resume", "--out", str(tmp_path))
    assert result.returncode == 2 and "no checkpoint to resume from" in result.stderr


def test_log_every_without_a_strategy_is_refused(cli, tmp_path):
    result = cli("h2", "train", "--log-every", "5", "--out", str(tmp_path))
    assert result.returncode == 2 and "--log-every needs --strategy" in result.stderr


@pytest.mark.parametrize("flag,value", [("--resharding", "full"), ("--optimizer-sharding", "zero1"),
                                        ("--schedule", "1f1b"), ("--stage-backend", "gloo")])
def test_pipeline_flags_without_a_strategy_are_refused(cli, tmp_path, flag, value):
    result = cli("h2", "train", flag, value, "--out", str(tmp_path))
    assert result.returncode == 2 and f"{flag} needs --strategy" in result.stderr
