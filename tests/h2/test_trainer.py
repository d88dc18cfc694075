import builtins
import dataclasses
import os
import shutil

import pytest
import torch

from h2.core.errors import UserError
from h2.model import preset
from h2.train import TrainConfig, Trainer
from h2.train import checkpoint as checkpoint_module
from h2.train.lr_schedule import learning_rate
from h2.train.metrics import read_metrics


def run(out, corpus, resume=False, **options):
    config = TrainConfig(**{"steps": 6, "micro_batch_size": 4, "warmup_steps": 2, **options})
    trainer = Trainer(preset("tiny"), config, str(out), resume=resume, corpus=corpus, show_progress=False)
    return trainer, trainer.run()


def losses(out):
    return [record["loss"] for record in read_metrics(os.path.join(out, "metrics.jsonl"))]


def test_metrics_log_has_one_record_per_step_with_the_documented_keys(tmp_path, corpus):
    run(tmp_path, corpus)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 7))
    for key in ("step", "loss", "lr", "tokens_per_s", "elapsed_s", "grad_norm"):
        assert all(key in r for r in records)
    assert records[-1]["elapsed_s"] > records[0]["elapsed_s"]


def test_two_n_steps_equal_n_steps_resume_n_more(tmp_path, corpus):
    run(tmp_path / "straight", corpus, steps=8)
    run(tmp_path / "resumed", corpus, steps=4, lr_decay_steps=8)
    run(tmp_path / "resumed", corpus, resume=True, steps=8)
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")


def test_resume_discards_metrics_logged_after_the_checkpoint(tmp_path, corpus):
    run(tmp_path, corpus, steps=6, checkpoint_every=3, keep_checkpoints=5)
    shutil.rmtree(tmp_path / "checkpoints" / "step_00000006")
    (tmp_path / "checkpoints" / "latest").write_text("step_00000003\n")
    trainer, _ = run(tmp_path, corpus, resume=True, steps=3)
    assert trainer.step == 3
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.parametrize("fail_on_call", [1, 2, 3])  # the shard's rename, the manifest's, the pointer's
def test_interrupted_checkpoint_write_leaves_the_previous_one_loadable(tmp_path, corpus, monkeypatch, fail_on_call):
    trainer, _ = run(tmp_path, corpus, steps=2)
    calls = []
    real_replace = os.replace

    def crash_on_rename(src, dst):  # the process dies after writing a file, before its rename
        calls.append(dst)
        if len(calls) == fail_on_call:
            raise KeyboardInterrupt("simulated kill")
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", crash_on_rename)
    trainer.train_step()
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint()
    monkeypatch.undo()
    assert checkpoint_module.CheckpointDir(str(tmp_path)).load_latest().step == 2
    assert not [path for path in (tmp_path / "checkpoints").rglob("*") if ".tmp." in path.name]


def test_torn_checkpoint_file_is_reported_not_crashed_on(tmp_path, corpus):
    run(tmp_path, corpus, steps=2)
    (tmp_path / "checkpoints" / "step_00000002" / "rank_00000.safetensors").write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(UserError, match=r"rank_00000.safetensors: 9 bytes, the manifest says \d+ \(cut short"):
        run(tmp_path, corpus, resume=True, steps=4)


def test_gradient_accumulation_matches_one_large_batch(tmp_path, corpus):
    run(tmp_path / "large", corpus, micro_batch_size=8, micro_batches=1)
    run(tmp_path / "accumulated", corpus, micro_batch_size=4, micro_batches=2)
    torch.testing.assert_close(losses(tmp_path / "accumulated"), losses(tmp_path / "large"), rtol=1e-5, atol=0)


def test_bf16_trains_with_finite_losses_that_differ_from_fp32(tmp_path, corpus):
    run(tmp_path / "fp32", corpus)
    run(tmp_path / "bf16", corpus, dtype="bf16")
    bf16 = losses(tmp_path / "bf16")
    assert all(torch.isfinite(torch.tensor(bf16)))
    assert bf16 != losses(tmp_path / "fp32")
    torch.testing.assert_close(bf16, losses(tmp_path / "fp32"), rtol=0.05, atol=0)


def test_resumed_run_refuses_a_changed_hyperparameter(tmp_path, corpus):
    run(tmp_path, corpus, steps=2)
    config = TrainConfig(steps=4, micro_batch_size=4, lr=0.1)
    with pytest.raises(UserError, match="--lr 0.1 differs from the checkpoint's"):
        Trainer(preset("tiny"), config, str(tmp_path), resume=True, explicit=frozenset({"lr"}), corpus=corpus)


def test_fresh_run_refuses_a_folder_with_checkpoints_unless_overwriting(tmp_path, corpus):
    run(tmp_path, corpus, steps=2)
    with pytest.raises(UserError, match="--resume to continue it or --overwrite"):
        run(tmp_path, corpus, steps=2)
    trainer = Trainer(preset("tiny"), TrainConfig(steps=1, micro_batch_size=4), str(tmp_path), overwrite=True,
                      corpus=corpus, show_progress=False)
    trainer.run()
    assert checkpoint_module.CheckpointDir(str(tmp_path)).steps() == [1]


def test_fresh_run_refuses_a_folder_with_logged_metrics_and_no_checkpoint(tmp_path, corpus):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    with pytest.raises(UserError, match=r"holds the metrics of an earlier run \(1 step logged, no checkpoint\)"):
        run(tmp_path, corpus, steps=1)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 5.0}\n'


def kill_when_the_log_is_opened_for_writing(monkeypatch):
    """The process dies once the metrics log (or a file beside it named after it) is open for writing."""
    real_open = builtins.open

    def open_then_die(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if os.path.basename(str(file)).startswith("metrics.jsonl") and any(c in mode for c in "wax+"):
            handle.close()
            raise KeyboardInterrupt("simulated kill")
        return handle

    monkeypatch.setattr(builtins, "open", open_then_die)


def kill_before_the_log_is_renamed(monkeypatch):
    real_replace = os.replace

    def die_before_renaming_the_log(src, dst):
        if os.path.basename(str(dst)) == "metrics.jsonl":
            raise KeyboardInterrupt("simulated kill")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", die_before_renaming_the_log)


@pytest.mark.parametrize("kill", [kill_when_the_log_is_opened_for_writing, kill_before_the_log_is_renamed])
def test_a_resume_killed_while_dropping_later_metrics_leaves_the_old_log_whole(tmp_path, corpus, monkeypatch, kill):
    run(tmp_path, corpus, steps=4, checkpoint_every=2, keep_checkpoints=5)
    shutil.rmtree(tmp_path / "checkpoints" / "step_00000004")
    (tmp_path / "checkpoints" / "latest").write_text("step_00000002\n")
    before = (tmp_path / "metrics.jsonl").read_text()
    kill(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, corpus, resume=True, steps=4)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_resume_refuses_a_checkpoint_of_another_model_naming_the_difference(tmp_path, corpus):
    run(tmp_path, corpus, steps=1)
    other = dataclasses.replace(preset("tiny"), num_layers=2)
    with pytest.raises(UserError,
                       match=r"checkpoint is of model 'tiny', this run's model is 'tiny' \(num_layers 4 vs 2\)"):
        Trainer(other, TrainConfig(steps=2, micro_batch_size=4), str(tmp_path), resume=True, corpus=corpus)


def test_warmup_then_cosine_to_min_lr():
    schedule = dict(lr=1.0, min_lr=0.1, warmup_steps=4, decay_steps=14)
    assert learning_rate(0, **schedule) == 0.25
    assert learning_rate(3, **schedule) == 1.0
    assert learning_rate(9, **schedule) == pytest.approx(0.55)
    assert learning_rate(14, **schedule) == 0.1 == learning_rate(100, **schedule)


def test_gradient_clipping_bounds_the_update(tmp_path, corpus):
    _, records = run(tmp_path, corpus, steps=1, grad_clip=1e-6, lr=1.0, warmup_steps=0)
    assert records[0]["grad_norm"] > 1e-6
