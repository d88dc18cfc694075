"""`h2 train --strategy` (torchrun of `python -m h2.cli.rank`), as a user launches it; and the one-line errors."""

from __future__ import annotations

import json
import os

import pytest

from h2.core.errors import UserError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FIG8 = os.path.join(REPO_ROOT, "configs", "strategies", "local-fig8-pp3.yaml")


def test_run_without_torchrun_is_a_one_line_error_naming_the_process_count(cli, tmp_path):
    from h2.core.training import RunOptions
    from h2.launch.contract import write_job
    from h2.launch.pipeline_job import resolve_pipeline_job

    run = RunOptions(strategy=FIG8, out=str(tmp_path / "run"))
    job, _ = resolve_pipeline_job({"strategy": FIG8, "steps": 1, "out": run.out}, run)
    write_job(tmp_path / "job.yaml", job)
    result = cli("h2.cli.rank", "--job", str(tmp_path / "job.yaml"), env={"WORLD_SIZE": ""})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "--nproc-per-node 4" in result.stderr


def test_run_with_an_unknown_p2p_backend_is_a_one_line_error(cli, tmp_path):
    # the launcher refuses it: a rank checks no option of the job it is handed
    result = cli("h2", "train", "--strategy", FIG8, "--p2p-backend", "carrier-pigeon", "--steps", "1", "--out",
                 str(tmp_path / "run"))
    assert result.returncode == 2
    assert "--p2p-backend must be one of gloo, dicomm" in result.stderr
    assert not (tmp_path / "run").exists()


PP2 = os.path.join(REPO_ROOT, "configs", "strategies", "local-tiny-pp2.yaml")


@pytest.mark.slow
def test_h2_train_with_a_strategy_launches_the_pipeline_on_local_processes(tmp_path, cli):
    out = tmp_path / "pp2"
    result = cli("h2", "train", "--strategy", PP2, "--steps", "2", "--out", str(out), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stage 1: chip emu-small (emulated on cpu), tp 1 x dp 1, layers 2..3, no recompute" in result.stdout
    with open(out / "metrics.jsonl") as handle:
        records = [json.loads(line) for line in handle]
    assert [r["step"] for r in records] == [1, 2]
    assert {"step", "loss", "lr", "tokens_per_s", "elapsed_s", "grad_norm"} <= set(records[0])
    assert sorted(os.listdir(out)) == [".h2.lock", "checkpoints", "metrics.jsonl",
                                       "stage_report.json"]  # only the last stage's first rank logs
    assert sorted(os.listdir(out / "checkpoints" / "step_00000002")) == [
        "manifest.json", "rank_00000.safetensors", "rank_00001.safetensors"
    ]


def test_h2_train_with_a_strategy_and_the_wrong_process_count_is_a_one_line_error(cli):
    result = cli("h2", "train", "--strategy", PP2, "--nproc", "3")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.strip().endswith(f"error: {PP2}: needs 2 processes (sum of tp * dp over stages), --nproc is 3")


def test_h2_train_with_an_unknown_stage_backend_is_refused_before_launching(cli):
    result = cli("h2", "train", "--strategy", PP2, "--stage-backend", "nccl")
    assert result.returncode == 2
    assert result.stderr.strip().endswith("error: --stage-backend must be one of auto, gloo, dicomm, got 'nccl'")
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_h2_train_passes_pipeline_options_through_to_every_rank(tmp_path, cli):
    out = tmp_path / "fig8-full"
    result = cli("h2", "train", "--strategy", FIG8, "--steps", "1", "--out", str(out), "--resharding", "full",
                 "--optimizer-sharding", "zero1", "--stage-backend", "gloo", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "metrics.jsonl") as handle:
        record = json.loads(handle.readline())
    # Full tensors over tp 1 -> 2 -> 1: per micro-batch 2 + 1 copies forward, 1 + 2 backward, of a
    # 2 x 64 x 64 fp32 activation; sliced mode would send 4 copies.
    assert record["cross_stage_bytes"] == 4 * 6 * 2 * 64 * 64 * 4


def test_h2_train_refuses_gloo_inside_stages_on_a_vendor_device_before_launching(cli):
    result = cli("h2", "train", "--strategy", PP2, "--device", "dipu", "--stage-backend", "gloo")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "--stage-backend gloo cannot move dipu tensors inside a stage" in result.stderr


def test_h2_train_refuses_a_stage_larger_than_the_host_memory_before_launching(tmp_path, cli):
    with open(PP2) as handle:
        # one huge micro-batch (several would be refused earlier, as more sequences per step than a step may hold)
        strategy = handle.read().replace("micro_batch_size: 2", f"micro_batch_size: {1 << 24}").replace(
            "micro_batches: 8", "micro_batches: 1")
    path = tmp_path / "huge-batch.yaml"
    path.write_text(strategy)
    result = cli("h2", "train", "--strategy", str(path), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr[-2000:]
    assert "h2: error: rank 0 (stage 0, chip emu-big) needs at least " in result.stderr
    assert "GB host memory available (MemAvailable)" in result.stderr


def test_a_rank_refuses_a_stage_larger_than_its_device_memory_before_building_it():
    import yaml

    from h2.core.ranks import RankFailure
    from heteropp_launch import run_pipeline

    with open(PP2) as handle:
        data = yaml.safe_load(handle)
    data["micro_batch_size"], data["micro_batches"] = 1 << 24, 1  # one huge micro-batch: the memory check's case
    refusal = (r"rank (0|1) \(stage \1, chip emu-(big|small)\) needs at least [0-9.]+ GB .* more than the [0-9.]+ GB "
               r"host memory available \(MemAvailable\)")
    with pytest.raises(RankFailure, match=refusal):
        run_pipeline(data, 1)


def test_ranks_that_each_fit_the_host_but_not_together_are_refused_before_launching(monkeypatch):
    from h2.core.strategy import load_strategy
    from h2.core.training import TrainConfig
    from h2.train import memory_check
    from heteropp.engine import train_config_for
    from heteropp.topology import Topology

    strategy = load_strategy(PP2)
    config = train_config_for(strategy, TrainConfig())
    topology = Topology.from_strategy(strategy)
    each = [memory_check.pipeline_rank_bytes(strategy.model_config(), config, topology, rank) for rank in (0, 1)]
    host = (max(each) + min(each) // 2, "host memory available (MemAvailable)")
    monkeypatch.setattr(memory_check, "free_bytes", lambda device: host)
    with pytest.raises(UserError,
                       match=r"the 2 ranks whose memory is this host's .* need at least [0-9.]+ MB together"):
        memory_check.check_pipeline_fits(strategy, TrainConfig())
