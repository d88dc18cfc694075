"""`--log-to tensorboard,wandb`: the metrics log's records also go to TensorBoard event files (read back
with tensorboard's own reader) and to an offline W&B run; a missing package is one line, before any work."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from h2.core.model_config import preset
from h2.train import TrainConfig, Trainer
from h2.train.loggers import scalars

TRAIN_SCALARS = {
    "train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "train/tokens_per_s": "tokens_per_s",
    "val/loss": "val_loss", "val/ppl": "val_ppl"
}


def run(out, corpus, **options) -> list[dict]:
    config = TrainConfig(**({"steps": 4, "micro_batch_size": 4, "eval_every": 2, "eval_batches": 1} | options))
    trainer = Trainer(preset("tiny"), config, str(out), corpus=corpus, show_progress=False)
    try:
        return trainer.run()
    finally:
        trainer.metrics.close()


def test_tensorboard_event_files_hold_every_logged_scalar_at_its_step(tmp_path, corpus):
    records = run(tmp_path, corpus, log_to="tensorboard")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(TRAIN_SCALARS) <= set(events.Tags()["scalars"])
    for tag, field in TRAIN_SCALARS.items():
        logged = {event.step: event.value for event in events.Scalars(tag)}
        assert logged == {r["step"]: pytest.approx(r[field], rel=1e-6) for r in records if field in r}, tag


def test_a_resumed_run_replaces_the_tensorboard_steps_after_its_checkpoint(tmp_path, corpus):
    run(tmp_path, corpus, steps=4, checkpoint_every=2, keep_checkpoints=5, log_to="tensorboard")
    shutil.rmtree(tmp_path / "checkpoints" / "step_00000004")
    (tmp_path / "checkpoints" / "latest").write_text("step_00000002\n")
    config = TrainConfig(steps=4, micro_batch_size=4, eval_every=2, eval_batches=1, log_to="tensorboard")
    trainer = Trainer(preset("tiny"), config, str(tmp_path), resume=True, corpus=corpus, show_progress=False)
    records = trainer.run()
    trainer.metrics.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    logged = [(event.step, event.value) for event in events.Scalars("train/loss")]
    assert [step for step, _ in logged] == [1, 2, 3, 4]
    assert [value for _, value in logged[2:]] == [pytest.approx(r["loss"], rel=1e-6) for r in records]


def test_wandb_writes_an_offline_run_under_the_output_folder(tmp_path, corpus):
    run(tmp_path, corpus, log_to="wandb")
    (folder, ) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    (data, ) = glob.glob(os.path.join(folder, "run-*.wandb"))
    assert wandb_file_holds(data, (b"train/loss", b"val/loss"))


def wandb_file_holds(path: str, keys: tuple[bytes, ...], wait_s: float = 60.0) -> bool:
    """Whether W&B's run file holds every key; its writer (the wandb-core service process) may still be
    flushing when finish() returns on a loaded host, so the file is read again until `wait_s` passes."""
    deadline = time.monotonic() + wait_s
    while True:
        with open(path, "rb") as handle:
            written = handle.read()
        if all(key in written for key in keys) or time.monotonic() > deadline:
            return all(key in written for key in keys)
        time.sleep(0.5)


def test_a_pipeline_records_peak_memory_is_logged_per_stage():
    record = {"step": 3, "loss": 2.5, "peak_allocated_bytes": [4_000_000, None, 2_500_000]}
    assert scalars(record) == {"train/loss": 2.5, "memory/stage_0_peak_mb": 4.0, "memory/stage_2_peak_mb": 2.5}


def h2_without(package: str, *args: str) -> subprocess.CompletedProcess:
    """`h2 ARGS` in a fresh interpreter where importing `package` fails, as when it is not installed."""
    code = (f"import sys; sys.modules[{package!r}] = None; from h2.cli.main import main; "
            f"sys.exit(main({list(args)!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("logger", ["tensorboard", "wandb"])
def test_a_missing_logger_package_is_one_line_before_the_run_starts(tmp_path, logger):
    out = tmp_path / "run"
    done = h2_without(logger, "train", "--preset", "tiny", "--steps", "2", "--log-to", f"tensorboard,{logger}", "--out",
                      str(out))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"h2: error: --log-to {logger}: the Python package '{logger}' is not installed "
                           f"(pip install {logger})\n")
    assert not out.exists()


def test_a_pipeline_job_refuses_a_missing_logger_package_before_starting_ranks(tmp_path):
    done = h2_without("wandb", "train", "--strategy", "configs/strategies/local-fig8-pp3.yaml", "--steps", "2",
                      "--log-to", "wandb", "--out", str(tmp_path / "pp"))
    assert done.returncode == 2, done.stderr
    assert done.stderr == "h2: error: --log-to wandb: the Python package 'wandb' is not installed (pip install wandb)\n"
