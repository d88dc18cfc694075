"""`h2 train --config job.yaml`: a job file with the flags' names, flags overriding it; and the flags
generated from the config classes (one source of names, defaults and help)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from h2.core import flags
from h2.core.errors import UserError
from h2.core.training import PipelineOptions, RunOptions, TrainConfig


def read_metrics(out) -> list[dict]:
    with open(out / "metrics.jsonl") as handle:
        return [json.loads(line) for line in handle]


def test_a_job_file_runs_and_a_flag_overrides_it(cli, tmp_path):
    out = tmp_path / "run"
    job = tmp_path / "job.yaml"
    job.write_text(f"preset: tiny\nsteps: 3\nlr: 0.002\nwarmup_steps: 0\nout: {out}\nquiet: true\n")
    result = cli("h2", "train", "--config", str(job), "--steps", "5")
    assert result.returncode == 0, result.stderr
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]  # the flag's 5, not the file's 3
    assert records[0]["lr"] == pytest.approx(0.002)  # the file's learning rate (no warm-up)


def test_an_unknown_key_in_a_job_file_is_one_line_naming_file_and_key(cli, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("steps: 3\nlearning_rate: 0.1\n")
    result = cli("h2", "train", "--config", str(job), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"{job}: unknown key 'learning_rate'" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_mistyped_value_in_a_job_file_names_file_and_key(cli, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("steps: many\n")
    result = cli("h2", "train", "--config", str(job))
    assert result.returncode == 2 and f"{job}: key 'steps': expected an integer" in result.stderr


def test_every_documented_field_becomes_a_flag_with_its_default_in_the_help():
    parser = argparse.ArgumentParser()
    flags.add_flags(parser, TrainConfig)
    help_text = " ".join(parser.format_help().split())
    for field in dataclasses.fields(TrainConfig):
        assert "--" + field.name.replace("_", "-") in help_text
    assert "peak learning rate (default 0.003)" in help_text
    args = parser.parse_args(["--lr", "0.5", "--dtype", "bf16"])
    assert flags.given(args, TrainConfig) == {"lr": 0.5, "dtype": "bf16"}


def test_a_boolean_that_defaults_to_true_gets_a_no_flag():
    parser = argparse.ArgumentParser()
    flags.add_flags(parser, PipelineOptions)
    assert flags.given(parser.parse_args(["--no-prefetch"]), PipelineOptions) == {"prefetch": False}
    assert flags.given(parser.parse_args([]), PipelineOptions) == {}


def test_a_written_job_reads_back_to_the_same_configs(tmp_path):
    path = tmp_path / "job.yaml"
    run, config, options = RunOptions(strategy="s.yaml", out="o"), TrainConfig(lr=0.01), PipelineOptions(threads=2)
    flags.write_job(path, run, config, options)
    values = flags.job_values(path, (RunOptions, TrainConfig, PipelineOptions))
    assert flags.build(RunOptions, values) == run
    assert flags.build(TrainConfig, values) == config
    assert flags.build(PipelineOptions, values) == options


def test_a_written_job_leaves_unset_options_out(tmp_path):
    path = tmp_path / "job.yaml"
    flags.write_job(path, TrainConfig(seq_len=None, lr=0.01))
    values = flags.job_values(path, (TrainConfig,))
    assert "seq_len" not in values and values["lr"] == 0.01


def test_job_values_refuse_a_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- steps\n")
    with pytest.raises(UserError, match="top level must be a mapping"):
        flags.job_values(path, (TrainConfig,))
