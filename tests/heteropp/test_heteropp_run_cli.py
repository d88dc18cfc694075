"""`python -m heteropp.run` under torchrun, as a user launches it; and its one-line errors."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import REPO_ROOT

FIG8 = os.path.join(REPO_ROOT, "configs", "strategies", "local-fig8-pp3.yaml")


@pytest.mark.slow
def test_torchrun_launch_of_the_figure8_strategy_trains_and_only_one_rank_writes_metrics(tmp_path, cli):
    out = tmp_path / "run"
    result = cli("torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m", "heteropp.run",
                 "--strategy", FIG8, "--steps", "3", "--out", str(out), env={"OMP_NUM_THREADS": "1"}, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stage 1: chip emu-big (emulated on cpu), tp 2 x dp 1, layers 3..4, no recompute" in result.stdout
    with open(out / "metrics.jsonl") as handle:
        records = [json.loads(line) for line in handle]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert {"step", "loss", "lr", "tokens_per_s", "elapsed_s", "grad_norm"} <= set(records[0])
    assert sorted(os.listdir(out)) == ["metrics.jsonl"]


def test_run_without_torchrun_is_a_one_line_error_naming_the_process_count(cli):
    result = cli("heteropp.run", "--strategy", FIG8, "--steps", "1", env={"WORLD_SIZE": ""})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "--nproc-per-node 4" in result.stderr


def test_run_with_an_unknown_p2p_backend_is_a_one_line_error(cli):
    result = cli("heteropp.run", "--strategy", FIG8, "--p2p-backend", "carrier-pigeon", "--steps", "1")
    assert result.returncode == 2
    assert "--p2p-backend must be one of gloo, dicomm" in result.stderr
