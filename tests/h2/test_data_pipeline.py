"""A pipeline trains on the user's data exactly like the single-device trainer: both read `--data` and
`--tokenizer` through h2.data.load_data (2 stages, TP 1 then 2, a tokenizer trained here)."""

from __future__ import annotations

import pytest

from h2.cli.main import main
from h2.data import load_data
from h2.train.checkpoint import CheckpointDir
from tests.h2.test_data_sources import _texts, write_jsonl, write_parquet
from tests.heteropp.heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

pytestmark = pytest.mark.slow  # three processes

STEPS = 4


def test_a_tp2_pipeline_on_user_data_matches_the_single_device_trainer(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", _texts(200, 20))
    write_parquet(data / "b.parquet", _texts(100, 21))
    assert main(["tokenizer", "train", "--data", str(data), "--vocab-size", "300", "--out", str(tmp_path / "tok")]) == 0
    strategy = {
        "dp": 1, "micro_batches": 2, "micro_batch_size": 2, "seq_len": 32, "schedule": "1f1b", "model": {
            "preset": "tiny", "vocab_size": 300
        }, "stages": [{"chip": "cpu", "tp": 1, "layers": 2, "recompute": False},
                      {"chip": "cpu", "tp": 2, "layers": 2, "recompute": False}]
    }
    train = {"data": str(data), "tokenizer": str(tmp_path / "tok" / "tokenizer.json")}
    records, _ = run_pipeline(strategy, STEPS, out_dir=str(tmp_path / "pipeline"), train=train)
    reference = run_reference(strategy, STEPS, train=train)
    assert len(records) == STEPS
    assert max_relative_loss_difference(records, reference) < 1e-5
    expected = load_data(train["data"], tokenizer=train["tokenizer"], seq_len=32).train.corpus.fingerprint
    assert CheckpointDir(str(tmp_path / "pipeline")).load_latest().manifest["data"]["corpus"] == expected
