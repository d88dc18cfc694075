"""Where a run's metrics go besides `metrics.jsonl` (`--log-to tensorboard,wandb`).

Every trainer writes its records through one path, `MetricsLog.append` (h2.train.metrics), which hands
each record to the loggers opened here:

  tensorboard   event files under `<out>/tensorboard`, written by torch's SummaryWriter (the
                `tensorboard` package's format; `tensorboard --logdir <out>/tensorboard` shows them)
  wandb         a Weights & Biases run in offline mode under `<out>/wandb/offline-run-*`
                (`wandb sync` uploads it later; nothing leaves the machine during training)

Both packages are optional: `check_available` names a missing one in one line before any work starts.
Each record's scalars get fixed names (`SCALARS`): training loss, learning rate, gradient norm,
tokens/s and step time under `train/`, the validation loss and perplexity under `val/`, a
pipeline's peak device memory per stage under `memory/`.
"""

from __future__ import annotations

import importlib
import os

from h2.core.errors import UserError

# record field -> the scalar's name in the loggers
SCALARS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens_per_s": "train/tokens_per_s",
    "step_time_s": "train/step_time_s", "cross_stage_bytes": "train/cross_stage_bytes", "val_loss": "val/loss",
    "val_ppl": "val/ppl"
}
# logger -> the module it needs and the package that provides it
REQUIRES = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def check_available(names: tuple[str, ...]) -> None:
    """Refuse, in one line, a logger whose package cannot be imported."""
    for name in names:
        module, package = REQUIRES[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(f"--log-to {name}: the Python package '{package}' is not installed "
                            f"(pip install {package})") from None


def scalars(record: dict) -> dict[str, float]:
    """The record's values the loggers plot, by their names."""
    values = {tag: float(record[field]) for field, tag in SCALARS.items() if record.get(field) is not None}
    for stage, peak in enumerate(record.get("peak_allocated_bytes") or ()):
        if peak is not None:
            values[f"memory/stage_{stage}_peak_mb"] = peak / 1e6
    return values


class TensorBoardLogger:

    def __init__(self, out_dir: str, first_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run logs again the steps after its checkpoint: purge_step drops the old events of those.
        self.writer = SummaryWriter(log_dir=os.path.join(out_dir, "tensorboard"),
                                    purge_step=first_step + 1 if first_step else None)

    def write(self, record: dict) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:

    def __init__(self, out_dir: str, run_config: dict):
        import wandb

        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)
        name = os.path.basename(os.path.abspath(out_dir))
        self.run = wandb.init(mode="offline", dir=out_dir, project="h2", name=name, config=run_config,
                              settings=settings, reinit="create_new")

    def write(self, record: dict) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


def open_loggers(names: tuple[str, ...], out_dir: str, first_step: int, run_config: dict) -> list:
    """The loggers `names` (TrainConfig.loggers) writing under `out_dir`, continuing after `first_step`."""
    check_available(names)
    opened = []
    for name in names:
        opened.append(
            TensorBoardLogger(out_dir, first_step) if name == "tensorboard" else WandbLogger(out_dir, run_config))
    return opened
