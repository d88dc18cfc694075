"""Evaluation through a pipeline (forward only over the stages, TP and DP included) gives the validation
loss the single-device trainer gives on the same weights and data."""

from __future__ import annotations

import math
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from h2.data import load_data, load_stdlib_corpus
from h2.train.evaluation import model_loss, validation_batches
from h2.train.generation import load_run_model
from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

STEPS = 4
EVALUATION = {"eval_every": 2, "eval_batches": 2}


def strategy(stages, *, micro_batches=2, schedule="1f1b"):
    """`stages`: (chip, tp, layers, recompute, stage dp)."""
    return {
        "dp": 1, "micro_batches": micro_batches, "micro_batch_size": 2, "seq_len": 32, "schedule": schedule,
        "model": "tiny", "stages": [{"chip": chip, "tp": tp, "layers": layers, "recompute": recompute, "dp": dp}
                                    for chip, tp, layers, recompute, dp in stages]
    }


def validation(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in records if "val_loss" in r}


def evaluates_as_the_reference(data: dict, out_dir: str) -> None:
    records, _ = run_pipeline(data, STEPS, out_dir=out_dir, train=EVALUATION | {"log_to": "tensorboard"})
    reference = run_reference(data, STEPS, train=EVALUATION)
    assert max_relative_loss_difference(records, reference) < 1e-5
    ours, theirs = validation(records), validation(reference)
    assert sorted(ours) == [2, 4] and sorted(theirs) == [2, 4]
    assert all(ours[step] == pytest.approx(theirs[step], abs=1e-5) for step in ours)
    assert all(r["val_ppl"] == pytest.approx(math.exp(r["val_loss"])) for r in records if "val_loss" in r)
    events = EventAccumulator(os.path.join(out_dir, "tensorboard"))
    events.Reload()
    assert {event.step: event.value for event in events.Scalars("val/loss")} == pytest.approx(ours, rel=1e-6)
    # h2 generate's model: the checkpoint's stages and TP pieces assembled into the single-device model
    model, _ = load_run_model(out_dir)
    global_batch = data["dp"] * data["micro_batch_size"] * data["micro_batches"]
    _, stream, _ = load_data(seq_len=data["seq_len"], corpus=load_stdlib_corpus())
    losses = [
        model_loss(model, batch, data["micro_batch_size"], torch.device("cpu"))
        for batch in validation_batches(stream, global_batch, EVALUATION["eval_batches"])
    ]
    assert sum(losses) / len(losses) == pytest.approx(ours[STEPS], abs=1e-5)


def test_a_two_stage_pipeline_with_tp_dp_and_recompute_evaluates_as_the_single_device_trainer(tmp_path):
    """Stage 0: TP 2 with recompute; stage 1 (the loss): two data-parallel replicas."""
    evaluates_as_the_reference(strategy([("emu-big", 2, 2, True, 1), ("emu-small", 1, 2, False, 2)]), str(tmp_path))


@pytest.mark.slow
def test_zorse_ministages_of_uneven_mixed_groups_evaluate_as_the_single_device_trainer(tmp_path):
    """Two layer chunks per stage (the wrap-around from the last stage to stage 0), replicas taking 1 and 3
    rows of each micro-batch."""
    data = {
        "dp": 2, "micro_batches": 2, "micro_batch_size": 2, "seq_len": 32, "ministages": 2,
        "optimizer_sharding": "zero2", "model": "tiny", "stages": [{
            "chips": ["chip-a", "chip-b"], "rows": [1, 3], "tp": 1, "layers": 2
        }, {"chip": "chip-b", "dp": 1, "tp": 1, "layers": 2}]
    }
    evaluates_as_the_reference(data, str(tmp_path))
