"""`--eval-every N --eval-batches M` in the single-device trainer: the validation loss and perplexity on the
corpus's held-out tail, in metrics.jsonl and the progress line, the same batches each time, and no change
to any training step."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from h2.core.errors import UserError
from h2.core.model_config import preset
from h2.data import load_data
from h2.data.load import DEFAULT_VALIDATION_FRACTION
from h2.model.transformer import language_model_loss
from h2.train import TrainConfig, Trainer
from h2.train.progress import ProgressBar


def run(out, corpus, resume=False, **options):
    config = TrainConfig(**({"steps": 4, "micro_batch_size": 4, "eval_batches": 2} | options))
    trainer = Trainer(preset("tiny"), config, str(out), resume=resume, corpus=corpus, show_progress=False)
    return trainer, trainer.run()


def test_every_nth_step_logs_the_validation_loss_and_its_perplexity(tmp_path, corpus):
    trainer, records = run(tmp_path, corpus, eval_every=2)
    logged = trainer.metrics.records()
    assert [r["step"] for r in logged if "val_loss" in r] == [2, 4]
    assert all(r["val_ppl"] == pytest.approx(math.exp(r["val_loss"])) for r in logged if "val_loss" in r)
    assert logged == records


def test_the_validation_loss_is_the_mean_loss_of_the_first_m_batches_of_the_held_out_tail(tmp_path, corpus):
    trainer, records = run(tmp_path, corpus, eval_every=4, eval_batches=3)
    _, validation, _ = load_data(seq_len=64, seed=123, corpus=corpus)
    with torch.no_grad():
        losses = [
            language_model_loss(trainer.model(batch[:, :-1]), batch[:, 1:]).item()
            for batch in (validation.sequences(index * 4, 4) for index in range(3))
        ]
    assert records[-1]["val_loss"] == pytest.approx(sum(losses) / 3, abs=1e-6)
    assert len(trainer.stream.corpus) + len(validation.corpus) == len(corpus)  # it trains on the head only
    assert trainer.evaluate() == trainer.evaluate()  # the same batches each time


def test_training_reads_the_corpus_head_and_validation_its_tail(corpus):
    training, validation, _ = load_data(seq_len=64, seed=0, corpus=corpus)
    cut = len(corpus) - len(validation.corpus)
    assert len(validation.corpus) == pytest.approx(DEFAULT_VALIDATION_FRACTION * len(corpus), abs=1)
    assert np.array_equal(training.corpus.tokens, corpus.tokens[:cut])
    assert np.array_equal(validation.corpus.tokens, corpus.tokens[cut:])


def test_evaluating_changes_no_training_step(tmp_path, corpus):
    _, plain = run(tmp_path / "plain", corpus, steps=6)
    _, evaluated = run(tmp_path / "evaluated", corpus, steps=6, eval_every=1)
    assert [r["loss"] for r in evaluated] == [r["loss"] for r in plain]
    assert [r["grad_norm"] for r in evaluated] == [r["grad_norm"] for r in plain]


def test_a_resumed_run_evaluates_bit_for_bit_as_a_straight_one(tmp_path, corpus):
    _, straight = run(tmp_path / "straight", corpus, steps=6, eval_every=2)
    run(tmp_path / "resumed", corpus, steps=3, lr_decay_steps=6, eval_every=2)
    trainer, _ = run(tmp_path / "resumed", corpus, resume=True, steps=6, eval_every=2)
    fields = ("step", "loss", "val_loss", "val_ppl")
    assert [[r.get(f) for f in fields] for r in trainer.metrics.records()] == [[r.get(f) for f in fields]
                                                                               for r in straight]


def test_the_progress_line_shows_the_latest_validation_loss(tmp_path, corpus, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("h2.train.trainer.ProgressBar", lambda total, start: ProgressBar(total, start, stream=stream))
    config = TrainConfig(steps=3, micro_batch_size=4, eval_every=2, eval_batches=1)
    trainer = Trainer(preset("tiny"), config, str(tmp_path), corpus=corpus)
    records = trainer.run()
    last = stream.getvalue().splitlines()[-1]
    assert last.startswith("[") and " 3/3 " in last
    assert f"val_loss {records[1]['val_loss']:.4f} val_ppl {records[1]['val_ppl']:.2f}" in last


@pytest.mark.parametrize("option, message", [
    ({"eval_every": -1}, "training option 'eval_every' out of range: -1"),
    ({"eval_batches": 0}, "training option 'eval_batches' out of range: 0"),
    ({"log_to": "tensorboard,mlflow"}, "--log-to: unknown logger 'mlflow' (known: tensorboard, wandb)"),
])
def test_a_bad_evaluation_or_logging_option_is_one_line(option, message):
    with pytest.raises(UserError) as error:
        TrainConfig(**option)
    assert str(error.value) == message
