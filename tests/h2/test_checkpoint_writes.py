"""A full disk or an I/O error while a checkpoint is written: one line naming the file and the errno,
exit 1, the temporary removed and the previous checkpoint intact; a run whose checkpoints cannot fit
in the folder's free space is refused before it trains."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from h2.cli.main import main
from h2.core.errors import UserError
from h2.train import checkpoint as checkpoint_module
from h2.train.checkpoint import CheckpointDir, shard_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = [
    "train", "--preset", "tiny", "--steps", "2", "--checkpoint-every", "1", "--micro-batch-size", "2", "--seq-len",
    "32", "--warmup-steps", "1", "--quiet"
]

# `h2 train` in a process whose second checkpoint's shard write fails half-way with ENOSPC, or whose
# second manifest's rename fails with EIO (as a full or failing disk does).
FAIL = """
import errno, os, sys
import h2.train.checkpoint as checkpoint
from h2.cli.main import main

how = sys.argv[1]
real_chunk, real_replace, chunks = checkpoint._write_chunk, checkpoint.os.replace, []
checkpoint.WRITE_CHUNK = 1 << 16

def write_chunk(handle, chunk):
    chunks.append(len(chunk))
    if how == "ENOSPC" and "step_00000002" in handle.name and len(chunks) > 3:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real_chunk(handle, chunk)

def replace(src, dst):
    if how == "EIO" and dst.endswith("step_00000002/manifest.json"):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    real_replace(src, dst)

checkpoint._write_chunk, checkpoint.os.replace = write_chunk, replace
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("how, file, text", [("ENOSPC", shard_name(0), "No space left on device (ENOSPC)"),
                                             ("EIO", "manifest.json", "Input/output error (EIO)")])
def test_a_failed_checkpoint_write_is_one_line_exit_1_and_the_previous_checkpoint_stays(tmp_path, how, file, text):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", FAIL, how] + TRAIN + ["--out", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"h2: error: cannot write {out}/checkpoints/step_00000002/{file}: {text}; the previous "
        f"checkpoint {out}/checkpoints/step_00000001 is intact"
    ], result.stderr[-3000:]
    assert not [path for path in out.rglob("*") if ".tmp." in path.name]
    assert CheckpointDir(str(out)).load_latest(say=lambda line: None).step == 1


class Statvfs:
    f_bavail, f_frsize = 16, 4096  # 64 KiB free


def test_a_run_whose_checkpoints_cannot_fit_is_refused_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checkpoint_module.os, "statvfs", lambda path: Statvfs())
    out = tmp_path / "out"
    assert main(TRAIN + ["--out", str(out), "--keep-checkpoints", "3"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"output folder '{out}': its checkpoints need about" in line, line
    assert "(3 kept + 1 being written" in line and "but its file system has 64.0 KiB free" in line, line
    assert not os.path.exists(out / "metrics.jsonl") and not os.path.exists(out / "checkpoints")


def test_a_pipeline_whose_checkpoints_cannot_fit_is_refused_before_its_ranks_start(tmp_path, monkeypatch):
    from h2.core.strategy import load_strategy
    from h2.core.training import TrainConfig
    from h2.train.pipeline import checkpoint_bytes, pipeline_start

    strategy = load_strategy(os.path.join(REPO, "configs", "strategies", "local-tiny-pp2.yaml"))
    model = strategy.model_config()
    assert checkpoint_bytes(strategy, model) >= 3 * 4 * model.num_parameters()
    monkeypatch.setattr(checkpoint_module.os, "statvfs", lambda path: Statvfs())
    with pytest.raises(UserError, match="its checkpoints need about .* but its file system has 64.0 KiB free"):
        pipeline_start(strategy, TrainConfig(steps=2), str(tmp_path / "out"))


def test_a_resumed_run_counts_the_space_its_old_checkpoints_take(tmp_path, monkeypatch):
    folder = CheckpointDir(str(tmp_path))
    os.makedirs(folder.folder(1))
    with open(os.path.join(folder.folder(1), shard_name(0)), "wb") as handle:
        handle.write(bytes(200_000))
    monkeypatch.setattr(checkpoint_module.os, "statvfs", lambda path: Statvfs())
    folder.check_room(100_000, keep=1)  # 2 x 100 kB fit in 64 KiB free + the 200 kB the old one takes
    with pytest.raises(UserError, match="its checkpoints need about"):
        folder.check_room(200_000, keep=1)


def test_a_full_disk_while_logging_a_step_is_one_line_naming_the_log(tmp_path, monkeypatch):
    import builtins
    import errno

    from h2.core.errors import RunFailed
    from h2.train.metrics import MetricsLog

    real_open = builtins.open

    def full(file, mode="r", *args, **kwargs):
        if str(file).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    with pytest.raises(RunFailed, match=r"^cannot write .*metrics.jsonl: No space left on device \(ENOSPC\)$"):
        MetricsLog(str(tmp_path)).append({"step": 1, "loss": 5.0})
