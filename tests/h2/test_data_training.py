"""Training `tiny` on the user's own data: a jsonl and a parquet file written here, a tokenizer trained
by `h2 tokenizer train`; the loss falls, and a stopped or killed run resumed with --resume continues bit
for bit (the data position is in the checkpoint)."""

import json
import signal
import subprocess
import sys
import time

import pytest

from h2.cli.main import main
from h2.data import load_data, load_run_tokenizer, load_tokenizer
from h2.train.checkpoint import CheckpointDir
from h2.train.metrics import read_metrics
from tests.h2.test_data_sources import _texts, write_jsonl, write_parquet

STEPS = 100


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    folder = tmp_path_factory.mktemp("workload")
    data = folder / "data"
    data.mkdir()
    write_jsonl(data / "part-0.jsonl", _texts(400, 10))
    write_parquet(data / "part-1.parquet", _texts(300, 11))
    assert main(["tokenizer", "train", "--data", str(data), "--vocab-size", "320", "--out", str(folder / "tok")]) == 0
    model = folder / "model.yaml"
    model.write_text("preset: tiny\nvocab_size: 320\n")
    return {"data": str(data), "tokenizer": str(folder / "tok" / "tokenizer.json"), "model": str(model)}


def _train(workload, out, *extra) -> int:
    return main([
        "train", "--model-config", workload["model"], "--data", workload["data"], "--tokenizer", workload["tokenizer"],
        "--micro-batch-size", "4", "--seq-len", "32", "--lr-decay-steps",
        str(STEPS), "--checkpoint-every", "0", "--quiet", "--out",
        str(out), *extra
    ])


def test_loss_falls_and_a_resumed_run_is_bit_exact(workload, tmp_path):
    whole = tmp_path / "whole"
    assert _train(workload, whole, "--steps", str(STEPS)) == 0
    losses = [r["loss"] for r in read_metrics(whole / "metrics.jsonl")]
    assert len(losses) == STEPS
    assert sum(losses[-10:]) / 10 <= 0.8 * sum(losses[:10]) / 10
    kept = load_run_tokenizer(str(whole))  # the run keeps its tokenizer's files (for generate and export)
    assert kept.fingerprint == load_tokenizer(workload["tokenizer"]).fingerprint
    assert kept.decode(kept.encode("seven wizards")) == "seven wizards"

    parts = tmp_path / "parts"
    assert _train(workload, parts, "--steps", "50") == 0
    manifest = CheckpointDir(str(parts)).load_latest().manifest
    assert manifest["data"]["position"] == 50 * 4
    assert manifest["train_config"]["data"] == workload["data"]
    trained_on = load_data(workload["data"], tokenizer=workload["tokenizer"], seq_len=32).train.corpus.fingerprint
    assert manifest["data"]["corpus"] == trained_on
    # --resume without the data options reads the checkpoint's data again
    assert main([
        "train", "--model-config", workload["model"], "--out",
        str(parts), "--resume", "--steps",
        str(STEPS), "--quiet"
    ]) == 0
    resumed = [r["loss"] for r in read_metrics(parts / "metrics.jsonl")]
    assert resumed == losses


def test_resuming_on_other_data_is_refused(workload, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(workload, out, "--steps", "2") == 0
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({"text": t}) for t in _texts(300, 99)))
    capsys.readouterr()
    assert _train(workload, out, "--steps", "4", "--resume", "--data", str(other)) == 2
    assert "checkpoint data state: 'corpus'" in capsys.readouterr().err


def test_a_killed_run_resumes_bit_exact_with_its_data_position(workload, tmp_path):
    whole = tmp_path / "whole"
    assert _train(workload, whole, "--steps", str(STEPS)) == 0
    losses = [r["loss"] for r in read_metrics(whole / "metrics.jsonl")]

    killed = tmp_path / "killed"
    command = [
        sys.executable, "-m", "h2.cli.main", "train", "--model-config", workload["model"], "--data", workload["data"],
        "--tokenizer", workload["tokenizer"], "--micro-batch-size", "4", "--seq-len", "32", "--lr-decay-steps",
        str(STEPS), "--steps",
        str(STEPS), "--checkpoint-every", "10", "--keep-checkpoints", "20", "--quiet", "--out",
        str(killed)
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step_00000030" / "manifest.json").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    latest = CheckpointDir(str(killed)).load_latest()
    assert 30 <= latest.step < STEPS  # killed mid-run, after at least the step-30 checkpoint
    assert latest.manifest["data"]["position"] == latest.step * 4
    assert main([
        "train", "--model-config", workload["model"], "--out",
        str(killed), "--resume", "--steps",
        str(STEPS), "--quiet"
    ]) == 0
    assert [r["loss"] for r in read_metrics(killed / "metrics.jsonl")] == losses
