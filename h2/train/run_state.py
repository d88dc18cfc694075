"""How a run begins in its output folder, the same rule for both trainers:

- a fresh run refuses a folder that holds an earlier run (checkpoints, or steps logged in
  metrics.jsonl) unless `--overwrite`, which removes them;
- `--resume` continues from the newest complete checkpoint, which must be of the same kind of run
  (single-device or pipeline) and the same model; the run keeps the checkpoint's hyper-parameters
  (one given on the command line that differs is refused), and the metrics logged after the
  checkpoint are dropped;
- a job restarted after a failure (torchrun's elastic restart, `restarted`) continues from its
  newest checkpoint, or starts over when it has none yet;
- a run whose checkpoints would not fit in the folder's free space is refused (`check_room`: the
  trainer gives the estimate, parameters and optimizer state of all ranks, times keep + 1).

One run at a time uses a folder: the command lines take its lock first (h2.core.run_lock).

Everything is decided (and every refusal made) before anything in the folder changes; `prepare()`
then changes it, on one process only: it first removes the temporaries that killed writers of this
run left (`<file>.tmp.<pid>` of a process that no longer exists, see h2.core.files.atomic_write).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.training import TRAJECTORY_FIELDS, TrainConfig
from h2.train.checkpoint import Checkpoint, CheckpointDir
from h2.train.metrics import MetricsLog

SINGLE_DEVICE, PIPELINE = "single-device", "pipeline"


def _first_difference(saved: dict, current: dict) -> str:
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            return f"{key} {saved.get(key)!r} vs {current.get(key)!r}"
    return "no field"


# what atomic_write and check_writable leave behind when killed: `<name>.tmp.<pid>`, `.write_test.<pid>`
_TEMPORARY = re.compile(r"(\.tmp|^\.write_test)\.(\d+)$")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def sweep_stale_temporaries(out_dir: str) -> list[str]:
    """Remove the temporaries of this run's writers that died (in the folder, its checkpoints and
    each checkpoint's folder); returns their paths. A live writer's temporary is left alone."""
    folders = [out_dir, os.path.join(out_dir, "checkpoints")]
    if os.path.isdir(folders[1]):
        folders += [os.path.join(folders[1], name) for name in sorted(os.listdir(folders[1]))]
    removed = []
    for folder in filter(os.path.isdir, folders):
        for name in sorted(os.listdir(folder)):
            match = _TEMPORARY.search(name)
            path = os.path.join(folder, name)
            if match and os.path.isfile(path) and not _process_exists(int(match.group(2))):
                os.remove(path)
                removed.append(path)
    return removed


def check_writable(out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".write_test.{os.getpid()}")
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as error:
        raise UserError(f"output folder '{out_dir}' is not writable ({error.strerror or error})") from None


class RunStart:

    def __init__(self, out_dir: str, *, resume: bool = False, overwrite: bool = False, restarted: bool = False):
        if resume and overwrite:
            raise UserError("--resume and --overwrite exclude each other")
        check_writable(out_dir)
        self.out_dir, self.overwrite, self.restarted = out_dir, overwrite, restarted
        self.checkpoints = CheckpointDir(out_dir)
        self.checkpoints.check_folder()
        self.metrics = MetricsLog(out_dir)
        self.checkpoint: Checkpoint | None = None
        if resume or (restarted and self.checkpoints.complete_steps()):
            self.checkpoint = self.checkpoints.load_latest()
        elif not restarted and not overwrite:
            self._refuse_an_earlier_run()

    @property
    def step(self) -> int:
        return self.checkpoint.step if self.checkpoint else 0

    def _refuse_an_earlier_run(self) -> None:
        if self.checkpoints.steps():
            raise UserError(f"output folder '{self.out_dir}' holds checkpoints of an earlier run: "
                            f"pass --resume to continue it or --overwrite to start over")
        logged = len(self.metrics.records())
        if logged:
            raise UserError(f"output folder '{self.out_dir}' holds the metrics of an earlier run ({logged} step"
                            f"{'s' if logged != 1 else ''} logged, no checkpoint): pass --overwrite to start over")

    def check_room(self, checkpoint_bytes: int, keep: int) -> None:
        """Refuse, in one line, a run whose checkpoints (`keep` of `checkpoint_bytes` and one being
        written) would not fit in the output folder's free space."""
        self.checkpoints.check_room(checkpoint_bytes, keep)

    def check_continues(self, kind: str, model_config: ModelConfig) -> None:
        """Refuse, in one line, a checkpoint of another kind of run or of another model."""
        if self.checkpoint is None:
            return
        manifest, folder = self.checkpoint.manifest, self.checkpoint.folder
        saved_kind = manifest.get("kind")
        if saved_kind != kind:
            how = "with --strategy" if saved_kind == PIPELINE else "without --strategy"
            raise UserError(f"{folder}: the checkpoint is of a {saved_kind} run; resume it {how}")
        saved = manifest["model_config"]
        if saved != model_config.to_dict():
            raise UserError(f"{folder}: the checkpoint is of model '{saved.get('name')}', this run's model is "
                            f"'{model_config.name}' ({_first_difference(saved, model_config.to_dict())})")

    def adopt_trajectory(self, config: TrainConfig, explicit: frozenset[str],
                         fields: tuple[str, ...] = TRAJECTORY_FIELDS) -> TrainConfig:
        """`config` with the checkpoint's hyper-parameters; a flag given explicitly that differs is refused."""
        if self.checkpoint is None:
            return config
        saved = self.checkpoint.manifest["train_config"]
        for name in fields:
            if name in explicit and getattr(config, name) != saved[name]:
                raise UserError(f"--{name.replace('_', '-')} {getattr(config, name)} differs from the checkpoint's "
                                f"{saved[name]}; a resumed run keeps its hyper-parameters")
        return dataclasses.replace(config, **{name: saved[name] for name in fields})

    def prepare(self) -> None:
        """Make the folder what the run continues from (call on one process, after every check)."""
        swept = sweep_stale_temporaries(self.out_dir)
        if swept:
            print(
                f"h2: removed {len(swept)} temporar{'y' if len(swept) == 1 else 'ies'} left by killed writers "
                f"({swept[0]}{', ...' if len(swept) > 1 else ''})", file=sys.stderr, flush=True)
        if self.checkpoint is not None:
            self.metrics.keep_until(self.checkpoint.step)
        elif self.overwrite or self.restarted:
            self.checkpoints.remove_all()
            self.metrics.start_over()
        else:
            self.metrics.drop_torn_tail()
