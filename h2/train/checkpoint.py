"""Checkpoints of both trainers, in one format, written so that a kill at any moment leaves the
previous checkpoint loadable.

Layout in `<out>/checkpoints/`:

    step_00000006/
        rank_00000.pt    one shard per rank: its parameters and optimizer state, keyed by the
        rank_00001.pt    model's parameter names with how each tensor is cut (dim, index, parts),
        ...              and the rank's RNG states
        manifest.json    written last: step, elapsed time, model, hyper-parameters, data position,
                         the strategy of a pipeline run, the shards
    latest               one line naming the newest complete checkpoint's folder

Every file is written under a temporary name, flushed, fsynced and renamed into place. A
checkpoint is complete once its manifest is; `latest` is replaced only after that, and only then
are older checkpoints removed. A single-device run is a world of one rank whose shard holds whole
tensors. Reading assembles a tensor whole from the shards that hold its pieces, so a run can
continue under another layout (layers moved between stages, other TP or DP sizes).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from typing import Any, Callable

import numpy as np
import torch

from h2.core.errors import UserError
from heteropp.stage_parameters import shard_of, whole_of

FORMAT = "h2-checkpoint-1"
MANIFEST = "manifest.json"
_STEP_FOLDER = re.compile(r"^step_(\d+)$")


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write) -> None:
    """Call write(handle) on a temporary file beside `path`, fsync it, then rename over `path`."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def shard_name(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


# ---- how a tensor is cut into the pieces that ranks hold ------------------------------------------
def piece_layout(dim: int | None, index: int = 0, parts: int = 1) -> dict:
    """A piece of a tensor: chunk `index` of `parts` along `dim` (parts 1: the whole tensor; dim None:
    a whole tensor that several ranks hold alike)."""
    return {"dim": dim, "index": index, "parts": parts}


def cut(whole: torch.Tensor, layout: dict) -> torch.Tensor:
    """The piece `layout` of `whole`, as tensor parallelism cuts weights."""
    return shard_of(whole, layout["dim"], layout["index"], layout["parts"])


def _assemble(pieces: list[tuple[dict, torch.Tensor]], what: str) -> torch.Tensor:
    layout = pieces[0][0]
    if layout["parts"] == 1 or layout["dim"] is None:
        return pieces[0][1]
    by_index: dict[int, torch.Tensor] = {}
    for piece_layout_, tensor in pieces:
        by_index.setdefault(piece_layout_["index"], tensor)
    missing = [index for index in range(layout["parts"]) if index not in by_index]
    if missing:
        raise UserError(f"{what}: no shard holds piece {missing[0]} of {layout['parts']}")
    return whole_of([by_index[index] for index in range(layout["parts"])], layout["dim"])


# ---- RNG and optimizer state -------------------------------------------------------------------
def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _parameters_in_order(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The parameters in the order torch's optimizer state_dict numbers them."""
    return [param for group in optimizer.param_groups for param in group["params"]]


def optimizer_state_by_name(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, dict]:
    """Per-parameter optimizer state (AdamW: step, exp_avg, exp_avg_sq) keyed by parameter name;
    `names` maps id(parameter) to its name."""
    numbered = optimizer.state_dict()["state"]
    return {
        names[id(param)]: numbered[index] for index, param in enumerate(_parameters_in_order(optimizer))
        if index in numbered
    }


def load_optimizer_state_by_name(optimizer: torch.optim.Optimizer, names: dict[int, str],
                                 state_of: Callable[[str], dict]) -> None:
    """Give every parameter of `optimizer` the state `state_of(name)` (torch's load_state_dict moves
    it to the parameter's device and dtype)."""
    state_dict = optimizer.state_dict()
    state_dict["state"] = {
        index: state_of(names[id(param)]) for index, param in enumerate(_parameters_in_order(optimizer))
    }
    optimizer.load_state_dict(state_dict)


# ---- reading -----------------------------------------------------------------------------------
class Checkpoint:
    """A complete checkpoint: its manifest, and its shards read on demand (memory-mapped)."""

    def __init__(self, folder: str, manifest: dict):
        self.folder, self.manifest = folder, manifest
        self.step = int(manifest["step"])
        self._shards: dict[int, dict] = {}
        self._pieces: dict[str, dict[str, list]] | None = None

    def shard(self, rank: int) -> dict:
        if rank not in self._shards:
            path = os.path.join(self.folder, shard_name(rank))
            try:
                self._shards[rank] = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
            except FileNotFoundError:
                raise UserError(f"{path}: listed in {MANIFEST} but missing") from None
            except Exception as error:  # a damaged file must be reported, not crash with a traceback
                raise UserError(f"{path}: unreadable checkpoint shard ({type(error).__name__}: {error})") from None
        return self._shards[rank]

    def _index(self) -> dict[str, dict[str, list]]:
        """For every parameter name: its pieces ("parameters") and its optimizer state's pieces."""
        if self._pieces is None:
            self._pieces = {"parameters": {}, "optimizer": {}}
            for rank in range(int(self.manifest["world_size"])):
                shard = self.shard(rank)
                for name, tensor in shard["parameters"].items():
                    self._pieces["parameters"].setdefault(name, []).append((shard["layout"][name], tensor))
                for name, state in shard["optimizer"].items():
                    self._pieces["optimizer"].setdefault(name, []).append((shard["layout"][name], state))
        return self._pieces

    def parameter(self, name: str) -> torch.Tensor:
        """Parameter `name` whole."""
        pieces = self._index()["parameters"].get(name)
        if not pieces:
            raise UserError(f"{self.folder}: no shard holds parameter '{name}'")
        return _assemble(pieces, f"{self.folder}: parameter '{name}'")

    def optimizer_state(self, name: str) -> dict:
        """The optimizer state of parameter `name`, its tensors whole (scalars such as step as saved)."""
        pieces = self._index()["optimizer"].get(name)
        if not pieces:
            raise UserError(f"{self.folder}: no shard holds optimizer state for '{name}'")
        first = pieces[0][1]
        return {
            key: value if not torch.is_tensor(value) or value.dim() == 0 else _assemble(
                [(layout, state[key])
                 for layout, state in pieces], f"{self.folder}: optimizer state '{key}' of '{name}'")
            for key, value in first.items()
        }


# ---- the folder of checkpoints -------------------------------------------------------------------
class CheckpointDir:

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "checkpoints")
        self.pointer = os.path.join(self.path, "latest")

    def steps(self) -> list[int]:
        """Steps with a checkpoint folder, complete or not."""
        if not os.path.isdir(self.path):
            return []
        return sorted(int(m.group(1)) for m in map(_STEP_FOLDER.match, os.listdir(self.path)) if m)

    def folder(self, step: int) -> str:
        return os.path.join(self.path, f"step_{step:08d}")

    def latest_step(self) -> int | None:
        try:
            with open(self.pointer, "rb") as handle:
                name = handle.read().decode("utf-8", errors="replace").strip()
        except FileNotFoundError:
            return None
        match = _STEP_FOLDER.match(name)
        if not match:
            raise UserError(f"{self.pointer}: does not name a checkpoint folder (got {name!r})")
        return int(match.group(1))

    def write_shard(self, step: int, rank: int, shard: dict) -> None:
        """Rank `rank`'s part of checkpoint `step` (the manifest, written by `commit`, completes it)."""
        folder = self.folder(step)
        os.makedirs(folder, exist_ok=True)
        atomic_write(os.path.join(folder, shard_name(rank)), lambda handle: torch.save(shard, handle))

    def commit(self, step: int, manifest: dict, keep: int) -> str:
        """Complete checkpoint `step` once every shard is written: its manifest, then `latest`, then
        remove all but the `keep` newest checkpoints up to `step`, any beyond it (the future of a run
        that was resumed from an earlier one), and any earlier one left without its manifest (a
        write that was killed)."""
        folder = self.folder(step)
        text = json.dumps({"format": FORMAT, **manifest}, indent=1).encode() + b"\n"
        atomic_write(os.path.join(folder, MANIFEST), lambda handle: handle.write(text))
        atomic_write(self.pointer, lambda handle: handle.write(os.path.basename(folder).encode() + b"\n"))
        complete = [s for s in self.steps() if s <= step and os.path.exists(os.path.join(self.folder(s), MANIFEST))]
        incomplete = [s for s in self.steps() if s < step and s not in complete]
        for old in [s for s in self.steps() if s > step] + incomplete + complete[:-keep]:
            if old != step:
                shutil.rmtree(self.folder(old), ignore_errors=True)
        return folder

    def remove_all(self) -> None:
        for step in self.steps():
            shutil.rmtree(self.folder(step), ignore_errors=True)
        if os.path.exists(self.pointer):
            os.remove(self.pointer)

    def complete_steps(self) -> list[int]:
        """Steps whose checkpoint has its manifest (a write that was killed leaves none)."""
        return [step for step in self.steps() if os.path.exists(os.path.join(self.folder(step), MANIFEST))]

    def load(self, step: int) -> Checkpoint:
        """Checkpoint `step`, its manifest and every shard it lists checked readable."""
        folder = self.folder(step)
        path = os.path.join(folder, MANIFEST)
        try:
            with open(path, encoding="utf-8") as handle:
                manifest = json.load(handle)
        except FileNotFoundError:
            raise UserError(f"{path}: missing") from None
        except (OSError, ValueError) as error:
            raise UserError(f"{path}: unreadable checkpoint manifest ({type(error).__name__}: {error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise UserError(f"{path}: not an H2 checkpoint manifest (field 'format' is not {FORMAT!r})")
        checkpoint = Checkpoint(folder, manifest)
        for rank in range(int(manifest.get("world_size", 1))):
            checkpoint.shard(rank)
        return checkpoint

    def load_latest(self, say: Callable[[str], None] | None = None) -> Checkpoint:
        """The newest intact checkpoint: the one `latest` names, or when that one is damaged the newest
        complete one before it, with one line (through `say`, stderr by default) saying which."""
        say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        try:
            named = self.latest_step()
            pointer_problem = None if named is not None else f"{self.pointer}: missing"
        except UserError as error:
            named, pointer_problem = None, str(error)
        candidates = [step for step in reversed(self.complete_steps()) if named is None or step < named]
        if named is not None:
            candidates.insert(0, named)
        if not candidates:
            raise UserError(f"{self.path}: no checkpoint to resume from")
        skipped: list[str] = []
        for step in candidates:
            try:
                checkpoint = self.load(step)
            except UserError as error:
                skipped.append(str(error))
                continue
            if skipped or pointer_problem:
                reason = f"skipped {len(skipped)} newer: {skipped[0]}" if skipped else pointer_problem
                say(f"h2: resuming from {checkpoint.folder}, the newest intact checkpoint ({reason})")
            return checkpoint
        raise UserError(skipped[0] if len(skipped) ==
                        1 else f"{self.path}: no intact checkpoint ({len(skipped)} unusable; newest: {skipped[0]})")


def has_checkpoints(out_dir: str) -> bool:
    return bool(CheckpointDir(out_dir).steps())


def describe(manifest: dict) -> str:
    """How a checkpoint's run is named in messages: 'a pipeline run of model tiny' and the like."""
    kind = "a pipeline run" if manifest.get("strategy") else "a single-device run"
    return f"{kind} of model '{manifest['model_config']['name']}'"


def json_value(value: Any) -> Any:
    """`value` as JSON keeps it (tuples become lists), for comparing a manifest's fields."""
    return json.loads(json.dumps(value))
