"""`h2 train --config job.yaml`: a job file with the flags' names, flags overriding it; and the flags
generated from the config classes (one source of names, defaults and help)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

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
    values = flags.job_values(path, (TrainConfig, ))
    assert "seq_len" not in values and values["lr"] == 0.01


def test_job_values_refuse_a_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- steps\n")
    with pytest.raises(UserError, match="top level must be a mapping"):
        flags.job_values(path, (TrainConfig, ))


# ---- the resolved job a launcher hands its ranks (h2.launch.job) ----------------------------------------
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO_SITES = os.path.join(REPO_ROOT, "configs", "clusters", "local-2site.yaml")
TWO_SITE_PP2 = os.path.join(REPO_ROOT, "configs", "strategies", "local-2site-pp2.yaml")
TWO_NODES = ("chips:\n  - {name: A, count: 4, memory_gb: 1, chips_per_node: 2, tp_max: 2, intra_node_gbps: 10, "
             "inter_node_gbps: 1, latency_us: 7}\n")
TWO_NODE_PP2 = {
    "dp": 1, "micro_batches": 2, "micro_batch_size": 2, "model": "tiny", "stages": [{"chip": "A", "tp": 2, "layers": 2},
                                                                                    {"chip": "A", "tp": 2, "layers": 2}]
}


def resolved(tmp_path, strategy: str, cluster: str | None, **values):
    from h2.launch.pipeline_job import resolve_pipeline_job

    run = RunOptions(strategy=strategy, cluster=cluster, out=str(tmp_path / "run"))
    return resolve_pipeline_job({"strategy": strategy, "cluster": cluster, "out": run.out, **values}, run)


def test_a_resolved_job_reads_back_as_the_launcher_wrote_it_with_the_generated_orders(tmp_path):
    from h2.launch.contract import read_job, write_job

    job, _ = resolved(tmp_path, TWO_SITE_PP2, TWO_SITES, schedule="jeeves", steps=3, lr=0.01)
    write_job(tmp_path / "job.yaml", job)
    back = read_job(tmp_path / "job.yaml")
    assert back == job
    assert back.strategy.schedule == "jeeves" and back.strategy.orders[0].startswith("F0 F1 F2 F3 F4 F5 F6 F7 B0")
    assert [stage.device for stage in back.strategy.stages] == ["dipu", "dipu"]  # emulated chips
    assert back.train.steps == 3 and back.explicit == frozenset({"steps", "lr"})
    assert back.ranks[1].chip == "emu-south" and back.ranks[1].emulation["relative_speed"] == 0.2
    assert back.stage_links == "link stage 0 -> 1 (emulated): inter_site 0.01 GB/s, 20000 us"


def test_a_job_without_a_cluster_has_no_links_and_no_emulated_chips(tmp_path):
    job, cluster = resolved(tmp_path, TWO_SITE_PP2, None)
    assert cluster is None and job.chip_labels is None and job.stage_links is None
    assert [(entry.chip, entry.device, entry.emulation) for entry in job.ranks] == [("emu-north", "cpu", None),
                                                                                    ("emu-south", "cpu", None)]
    assert job.links(0) is None


@pytest.mark.parametrize("kernel_shaped", [False, True])
@pytest.mark.parametrize("case", ["two sites", "two nodes of one chip type"])
def test_a_ranks_links_in_the_job_file_are_those_the_cluster_file_gives(tmp_path, case, kernel_shaped):
    import yaml

    from h2.core.cluster import load_cluster
    from h2.core.links import RankLinks
    from h2.launch.contract import read_job, write_job

    if case == "two sites":
        strategy, cluster = TWO_SITE_PP2, TWO_SITES
    else:
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(TWO_NODE_PP2))
        (tmp_path / "c.yaml").write_text(TWO_NODES)
        strategy, cluster = str(tmp_path / "s.yaml"), str(tmp_path / "c.yaml")
    job, spec = resolved(tmp_path, strategy, cluster)
    write_job(tmp_path / "job.yaml", job)
    job = read_job(tmp_path / "job.yaml")
    world = job.strategy.world_size
    for rank in range(world):
        expected = RankLinks.for_strategy(job.strategy, load_cluster(cluster), rank, kernel_shaped)
        links = job.links(rank, kernel_shaped)
        assert [(links.class_to(peer), links.to(peer))
                for peer in range(world)] == [(expected.class_to(peer), expected.to(peer)) for peer in range(world)]


@pytest.mark.slow
def test_a_written_job_starts_by_hand_under_torchrun_and_trains(cli, tmp_path):
    out, job_folder = tmp_path / "run", tmp_path / "job"
    written = cli("h2", "train", "--strategy", "configs/strategies/local-tiny-pp2.yaml", "--steps", "2", "--out",
                  str(out), "--write-job", str(job_folder))
    job_path = job_folder / "job.yaml"
    assert written.returncode == 0, written.stderr
    assert f"-m h2.cli.rank --job {job_path}" in written.stdout and job_path.exists()
    assert not (out / "metrics.jsonl").exists()  # written, not started
    ranks = cli("torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "h2.cli.rank", "--job",
                str(job_path))
    assert ranks.returncode == 0, ranks.stderr[-2000:]
    assert [record["step"] for record in read_metrics(out)] == [1, 2]


def test_write_job_without_a_strategy_is_one_line(cli, tmp_path):
    result = cli("h2", "train", "--preset", "tiny", "--steps", "1", "--out", str(tmp_path / "run"), "--write-job",
                 str(tmp_path / "job"))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "--write-job needs --strategy" in result.stderr and not (tmp_path / "job").exists()
