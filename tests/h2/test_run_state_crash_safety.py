"""What a kill, a power loss or a full disk leaves in a run's folder, and how the next start copes."""

import os
import subprocess
import sys

import pytest

from h2.core.errors import UserError
from h2.model import preset
from h2.train import TrainConfig, Trainer
from h2.train.metrics import read_metrics


def run(out, corpus, resume=False, **options):
    config = TrainConfig(**{"steps": 2, "micro_batch_size": 2, "warmup_steps": 1, **options})
    trainer = Trainer(preset("tiny"), config, str(out), resume=resume, corpus=corpus, show_progress=False)
    return trainer, trainer.run()


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_metrics_reader_skips_a_torn_last_line_and_says_so(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "lo')
    assert read_metrics(str(path)) == [{"step": 1, "loss": 5.0}]
    assert "skipped a torn last line" in capsys.readouterr().err


def test_metrics_reader_refuses_a_damaged_line_before_the_last_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "lo\n{"step": 3, "loss": 4.0}\n')
    with pytest.raises(UserError, match="metrics.jsonl line 2: not a JSON record"):
        read_metrics(str(path))


def test_resume_after_a_torn_metrics_line_logs_every_step_on_its_own_line(tmp_path, corpus):
    run(tmp_path, corpus, steps=2)
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 3, "lo')  # killed mid-append after the checkpoint of step 2
    run(tmp_path, corpus, resume=True, steps=3)
    assert [record["step"] for record in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2, 3]


def test_a_fresh_run_after_a_torn_metrics_line_logs_every_step_on_its_own_line(tmp_path, corpus):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "lo')
    run(tmp_path, corpus, steps=2)
    assert [record["step"] for record in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]


def test_start_up_removes_temporaries_that_killed_writers_left(tmp_path, corpus):
    run(tmp_path, corpus, steps=2)
    pid = dead_pid()
    stale = [
        tmp_path / "checkpoints" / "step_00000002" / f"rank_00000.safetensors.tmp.{pid}",
        tmp_path / "checkpoints" / f"latest.tmp.{pid}", tmp_path / f"metrics.jsonl.tmp.{pid}"
    ]
    for path in stale:
        path.write_bytes(b"partial")
    run(tmp_path, corpus, resume=True, steps=3)
    assert [path for path in stale if path.exists()] == []


def test_start_up_sweep_leaves_a_live_writers_temporary_alone(tmp_path):
    from h2.train.run_state import sweep_stale_temporaries

    live = tmp_path / f"metrics.jsonl.tmp.{os.getpid()}"
    live.write_bytes(b"being written")
    assert sweep_stale_temporaries(str(tmp_path)) == [] and live.exists()


def test_resume_falls_back_to_the_newest_intact_checkpoint_with_one_line(tmp_path, corpus, capfd):
    run(tmp_path, corpus, steps=4, checkpoint_every=2, keep_checkpoints=3)
    (tmp_path / "checkpoints" / "step_00000004" / "rank_00000.safetensors").write_bytes(b"PK\x03\x04 torn")
    capfd.readouterr()
    trainer, _ = run(tmp_path, corpus, resume=True, steps=4)
    lines = [line for line in capfd.readouterr().err.splitlines() if "resuming from" in line]
    assert trainer.step == 4 and len(lines) == 1 and "step_00000002" in lines[0], lines


def test_resume_falls_back_past_a_torn_manifest(tmp_path, corpus):
    run(tmp_path, corpus, steps=4, checkpoint_every=2, keep_checkpoints=3)
    manifest = tmp_path / "checkpoints" / "step_00000004" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    trainer = Trainer(preset("tiny"), TrainConfig(steps=4, micro_batch_size=2, warmup_steps=1), str(tmp_path),
                      resume=True, corpus=corpus, show_progress=False)
    assert trainer.step == 2


def test_resume_with_every_checkpoint_damaged_is_one_line_error(tmp_path, corpus):
    run(tmp_path, corpus, steps=4, checkpoint_every=2, keep_checkpoints=3)
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step_{step:08d}" / "rank_00000.safetensors").write_bytes(b"torn")
    with pytest.raises(UserError, match="no intact checkpoint"):
        run(tmp_path, corpus, resume=True, steps=4)


def test_resume_falls_back_past_a_garbage_latest_pointer(tmp_path, corpus):
    run(tmp_path, corpus, steps=4, checkpoint_every=2, keep_checkpoints=3)
    (tmp_path / "checkpoints" / "latest").write_bytes(b"step_\xea\xf3\x97")
    trainer = Trainer(preset("tiny"), TrainConfig(steps=4, micro_batch_size=2, warmup_steps=1), str(tmp_path),
                      resume=True, corpus=corpus, show_progress=False)
    assert trainer.step == 4
