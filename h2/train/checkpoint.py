"""Checkpoints of both trainers, in one format, written so that a kill at any moment leaves the
previous checkpoint loadable, and checked when read so that a damaged one is never resumed from.

Layout in `<out>/checkpoints/`:

    step_00000006/
        rank_00000.safetensors   one shard per rank (safetensors): its parameters ("parameters/<name>"),
        rank_00001.safetensors   optimizer state ("optimizer/<name>/<key>") and torch RNG states
        ...                      ("rng/torch", "rng/cuda/<i>") as tensors; in the file's metadata (key
                                 "h2", JSON) how each tensor is cut (dim, index, parts), the optimizer's
                                 non-tensor values, the numpy and Python RNG states, the step and rank
        manifest.json            written last: step, elapsed time, model, hyper-parameters, data position,
                                 the strategy of a pipeline run; every shard's file, size and SHA-256;
                                 and the SHA-256 of the manifest's own content (manifest_sha256)
    latest                       one line naming the newest complete checkpoint's folder

Nothing is unpickled on load: tensors come from safetensors, everything else from JSON. A checkpoint
of the earlier format (h2-checkpoint-1, pickled `.pt` shards) is refused in one line.

Every file is written under a temporary name, flushed, fsynced and renamed into place. Each rank
writes its shard and, beside it, its size and SHA-256 (`rank_NNNNN.safetensors.sha256`); the
commit gathers those into the manifest. A checkpoint is complete once its manifest is; `latest` is
replaced only after that, and only then are older checkpoints removed. A write that fails (a full
disk, an I/O error) ends the run with one line naming the file and the errno (RunFailed, exit 1),
its temporary removed and the previous checkpoint untouched.

Reading checks the manifest's own digest, then every shard's size and SHA-256 against it, before a
tensor is read: a checkpoint that fails any check is skipped for the newest intact one before it,
with one line naming what was wrong (`load_latest`). A single-device run is a world of one rank
whose shard holds whole tensors. Reading assembles a tensor whole from the shards that hold its
pieces, so a run can continue under another layout (layers moved between stages, other TP or DP
sizes).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
from typing import Any, Callable

import numpy as np
import torch

from h2.core.errors import RunFailed, UserError, one_line
from h2.core.files import (
    DIGEST_SUFFIX,
    atomic_write,
    file_digest,
    os_error_text,
    read_digest_record,
    remove_quietly,
    write_digested,
)
from heteropp.stage_parameters import shard_of, whole_of

FORMAT = "h2-checkpoint-2"
# Formats this H2 wrote before, with why it no longer loads them.
OLD_FORMATS = {"h2-checkpoint-1": "its shards are pickled .pt files, which H2 no longer unpickles"}
MANIFEST = "manifest.json"
_STEP_FOLDER = re.compile(r"^step_(\d+)$")
WRITE_CHUNK = 1 << 24
# AdamW keeps two tensors per parameter (exp_avg, exp_avg_sq) beside it: a checkpoint holds three copies
ADAMW_COPIES = 3


def _write_chunk(handle, chunk: memoryview) -> None:
    handle.write(chunk)


def _write_all(handle, data: bytes) -> None:
    view = memoryview(data)
    for offset in range(0, len(view), WRITE_CHUNK):
        _write_chunk(handle, view[offset:offset + WRITE_CHUNK])


def shard_name(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


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


# ---- one shard as a safetensors file ------------------------------------------------------------
def _numpy_state_to_json(state: tuple) -> list:
    name, keys, position, has_gauss, cached = state
    return [name, [int(key) for key in keys], int(position), int(has_gauss), float(cached)]


def _numpy_state_from_json(state: list) -> tuple:
    name, keys, position, has_gauss, cached = state
    return name, np.array(keys, dtype=np.uint32), position, has_gauss, cached


def _python_state_to_json(state: tuple) -> list:
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _python_state_from_json(state: list) -> tuple:
    version, internal, gauss_next = state
    return version, tuple(internal), gauss_next


class _Tensors:
    """Tensors for safetensors: on the CPU, contiguous, none sharing storage with another."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[int] = set()

    def add(self, key: str, tensor: torch.Tensor) -> None:
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in self._storages and tensor.numel():
            tensor = tensor.clone()
        self._storages.add(tensor.untyped_storage().data_ptr())
        self.tensors[key] = tensor


def encode_shard(shard: dict, step: int, rank: int) -> bytes:
    """A rank's shard (parameters, layout, optimizer, rng and any JSON fields such as place) as the
    bytes of a safetensors file."""
    from safetensors.torch import save

    tensors, scalars = _Tensors(), {}
    for name, tensor in shard["parameters"].items():
        tensors.add(f"parameters/{name}", tensor)
    for name, state in shard["optimizer"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors.add(f"optimizer/{name}/{key}", value)
            else:
                scalars.setdefault(name, {})[key] = value
    rng = shard["rng"]
    tensors.add("rng/torch", rng["torch"])
    for index, state in enumerate(rng.get("cuda", [])):
        tensors.add(f"rng/cuda/{index}", state)
    fields = {key: value for key, value in shard.items() if key not in ("parameters", "optimizer", "rng")}
    meta = {
        "format": FORMAT, "step": step, "rank": rank, "fields": fields, "optimizer_scalars": scalars,
        "optimizer_names": sorted(shard["optimizer"]), "cuda_rng": len(rng.get("cuda", [])), "rng": {
            "numpy": _numpy_state_to_json(rng["numpy"]), "python": _python_state_to_json(rng["python"])
        }
    }
    return save(tensors.tensors, metadata={"h2": json.dumps(meta)})


def decode_shard(path: str, step: int, rank: int) -> dict:
    """The shard `encode_shard` wrote, as it was given; UserError naming `path` when it is not one."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as handle:
            meta = json.loads((handle.metadata() or {}).get("h2", "null"))
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # safetensors' own errors: the file must be reported, not crash with a traceback
        raise UserError(f"{path}: unreadable checkpoint shard ({type(error).__name__}: {one_line(error)})") \
            from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{path}: not an H2 checkpoint shard (its metadata has no 'h2' of format {FORMAT!r})")
    if (meta.get("step"), meta.get("rank")) != (step, rank):
        raise UserError(f"{path}: holds rank {meta.get('rank')} of step {meta.get('step')}, "
                        f"not rank {rank} of step {step}")
    try:
        return _shard_from(meta, tensors)
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"{path}: inconsistent checkpoint shard ({type(error).__name__}: {error})") from None


def _shard_from(meta: dict, tensors: dict[str, torch.Tensor]) -> dict:
    parameters = {key[len("parameters/"):]: value for key, value in tensors.items() if key.startswith("parameters/")}
    scalars = meta["optimizer_scalars"]
    optimizer: dict[str, dict] = {name: dict(scalars.get(name, {})) for name in meta["optimizer_names"]}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            name, state_key = key[len("optimizer/"):].rsplit("/", 1)
            optimizer[name][state_key] = value
    rng = {
        "torch": tensors["rng/torch"], "numpy": _numpy_state_from_json(meta["rng"]["numpy"]),
        "python": _python_state_from_json(meta["rng"]["python"])
    }
    if meta["cuda_rng"]:
        rng["cuda"] = [tensors[f"rng/cuda/{index}"] for index in range(meta["cuda_rng"])]
    shard = dict(meta["fields"])
    shard.update(parameters=parameters, optimizer=optimizer, rng=rng)
    return shard


# ---- the manifest's own digest ------------------------------------------------------------------
def manifest_digest(manifest: dict) -> str:
    """The SHA-256 of a manifest's content (without its `manifest_sha256`), as JSON reads it back."""
    content = {key: value for key, value in json.loads(json.dumps(manifest)).items() if key != "manifest_sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_manifest(path: str, manifest: Any, step: int) -> None:
    """UserError naming `path` unless `manifest` is an intact manifest of this format for `step`."""
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: not an H2 checkpoint manifest (not a JSON object)")
    found = manifest.get("format")
    if found in OLD_FORMATS:
        raise UserError(f"{path}: a checkpoint of the earlier format {found}, not loaded: {OLD_FORMATS[found]} "
                        f"(resume it with the H2 that wrote it, or start over)")
    if found != FORMAT:
        raise UserError(f"{path}: not an H2 checkpoint manifest (field 'format' is not {FORMAT!r})")
    if manifest.get("manifest_sha256") != manifest_digest(manifest):
        raise UserError(f"{path}: damaged (its content does not match its manifest_sha256)")
    if manifest.get("step") != step:
        raise UserError(f"{path}: names step {manifest.get('step')!r}, its folder is step {step}")
    world_size, shards = manifest.get("world_size"), manifest.get("shards")
    if not isinstance(world_size, int) or not isinstance(shards, list) or len(shards) != world_size or not all(
            isinstance(entry, dict) and entry.get("file") == shard_name(rank) for rank, entry in enumerate(shards)):
        raise UserError(f"{path}: its 'shards' do not list one file per rank of its world_size {world_size!r}")


def _check_shard_file(folder: str, entry: dict) -> None:
    """UserError unless the shard `entry` names has the size and SHA-256 the manifest gives."""
    path = os.path.join(folder, entry["file"])
    try:
        size = os.path.getsize(path)
        if size != entry.get("bytes"):
            raise UserError(f"{path}: {size} bytes, the manifest says {entry.get('bytes')} (cut short or replaced)")
        if file_digest(path) != entry.get("sha256"):
            raise UserError(f"{path}: its SHA-256 differs from the manifest's (damaged or replaced)")
    except FileNotFoundError:
        raise UserError(f"{path}: listed in {MANIFEST} but missing") from None
    except OSError as error:
        raise UserError(f"{path}: unreadable checkpoint shard ({os_error_text(error)})") from None


# ---- reading -----------------------------------------------------------------------------------
class Checkpoint:
    """A complete checkpoint, checked intact: its manifest, and its shards read on demand."""

    def __init__(self, folder: str, manifest: dict):
        self.folder, self.manifest = folder, manifest
        self.step = int(manifest["step"])
        self._shards: dict[int, dict] = {}
        self._pieces: dict[str, dict[str, list]] | None = None

    def shard(self, rank: int) -> dict:
        if rank not in self._shards:
            self._shards[rank] = decode_shard(os.path.join(self.folder, shard_name(rank)), self.step, rank)
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
        self.out_dir = out_dir
        self.path = os.path.join(out_dir, "checkpoints")
        self.pointer = os.path.join(self.path, "latest")

    def check_folder(self) -> None:
        """UserError when `checkpoints` is there but is not a folder."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise UserError(f"{self.path}: exists and is not a folder (the run keeps its checkpoints there); "
                            f"move it away")

    def steps(self) -> list[int]:
        """Steps with a checkpoint folder, complete or not."""
        if not os.path.isdir(self.path):
            return []
        try:
            names = os.listdir(self.path)
        except OSError as error:
            raise UserError(f"{self.path}: unreadable ({os_error_text(error)})") from None
        return sorted(int(m.group(1)) for m in map(_STEP_FOLDER.match, names) if m)

    def folder(self, step: int) -> str:
        return os.path.join(self.path, f"step_{step:08d}")

    def latest_step(self) -> int | None:
        try:
            with open(self.pointer, "rb") as handle:
                name = handle.read().decode("utf-8", errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise UserError(f"{self.pointer}: unreadable ({os_error_text(error)})") from None
        match = _STEP_FOLDER.match(name)
        if not match:
            raise UserError(f"{self.pointer}: does not name a checkpoint folder (got {name!r})")
        return int(match.group(1))

    def _previous(self, step: int) -> str:
        """How a failed write of checkpoint `step` names the checkpoint a resume would use."""
        try:
            named = self.latest_step()
        except UserError:
            named = None
        earlier = [s for s in self.complete_steps() if s < step]
        previous = named if named is not None and named < step else (earlier[-1] if earlier else None)
        return (f"the previous checkpoint {self.folder(previous)} is intact"
                if previous is not None else "no earlier checkpoint was written")

    def _writing(self, step: int, write: Callable[[], None]) -> None:
        """Run `write`; a failed write (RunFailed, OSError) ends in one line that also names the
        checkpoint a resume would continue from."""
        try:
            write()
        except RunFailed as error:
            raise RunFailed(f"{error}; {self._previous(step)}") from None
        except OSError as error:
            raise RunFailed(f"cannot write {error.filename or self.folder(step)}: {os_error_text(error)}; "
                            f"{self._previous(step)}") from None

    def write_shard(self, step: int, rank: int, shard: dict) -> None:
        """Rank `rank`'s part of checkpoint `step`, and beside it its size and SHA-256 (the manifest,
        written by `commit`, completes it)."""
        folder = self.folder(step)
        path = os.path.join(folder, shard_name(rank))
        data = encode_shard(shard, step, rank)

        def write() -> None:
            os.makedirs(folder, exist_ok=True)
            write_digested(path, data, _write_all)

        self._writing(step, write)

    def _shard_entries(self, folder: str, world_size: int) -> list[dict]:
        entries = []
        for rank in range(world_size):
            path = os.path.join(folder, shard_name(rank))
            try:
                written = read_digest_record(path)
                size = os.path.getsize(path)
            except (OSError, ValueError) as error:
                raise RunFailed(f"cannot commit {folder}: rank {rank}'s shard or its digest is not there "
                                f"({type(error).__name__}: {error})") from None
            if size != written["bytes"]:
                raise RunFailed(f"cannot commit {folder}: {path} has {size} bytes, its rank wrote {written['bytes']}")
            entries.append({"file": shard_name(rank), "bytes": size, "sha256": written["sha256"]})
        return entries

    def commit(self, step: int, manifest: dict, keep: int) -> str:
        """Complete checkpoint `step` once every shard is written: its manifest (listing every shard's
        size and SHA-256), then `latest`, then remove all but the `keep` newest checkpoints up to
        `step`, any beyond it (the future of a run that was resumed from an earlier one), and any
        earlier one left without its manifest (a write that was killed)."""
        folder = self.folder(step)
        complete = dict(format=FORMAT)
        complete.update(manifest)
        complete["shards"] = self._shard_entries(folder, int(manifest.get("world_size", 1)))
        complete["manifest_sha256"] = manifest_digest(complete)
        text = json.dumps(complete, indent=1).encode() + b"\n"

        def write() -> None:
            atomic_write(os.path.join(folder, MANIFEST), lambda handle: handle.write(text))
            atomic_write(self.pointer, lambda handle: handle.write(os.path.basename(folder).encode() + b"\n"))

        self._writing(step, write)
        for entry in complete["shards"]:
            remove_quietly(os.path.join(folder, entry["file"] + DIGEST_SUFFIX))
        done = [s for s in self.steps() if s <= step and os.path.exists(os.path.join(self.folder(s), MANIFEST))]
        incomplete = [s for s in self.steps() if s < step and s not in done]
        for old in [s for s in self.steps() if s > step] + incomplete + done[:-keep]:
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

    def bytes_held(self) -> int:
        """The bytes the checkpoints in the folder take (a run replaces them as it writes new ones)."""
        total = 0
        for root, _, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
        return total

    def check_room(self, checkpoint_bytes: int, keep: int) -> None:
        """UserError before training when `keep` checkpoints and one being written, `checkpoint_bytes`
        each, do not fit in the free space of the output folder's file system (with what the folder's
        checkpoints take now, which the run replaces)."""
        need = checkpoint_bytes * (max(keep, 1) + 1)
        probe = self.path if os.path.isdir(self.path) else self.out_dir
        stats = os.statvfs(probe)
        free = stats.f_bavail * stats.f_frsize
        if free + self.bytes_held() < need:
            raise UserError(f"output folder '{self.out_dir}': its checkpoints need about {_size(need)} ({max(keep, 1)} "
                            f"kept + 1 being written, {_size(checkpoint_bytes)} each) but its file system has "
                            f"{_size(free)} free; free space, lower --keep-checkpoints or choose another --out")

    def load(self, step: int) -> Checkpoint:
        """Checkpoint `step`, its manifest checked intact, every shard it lists checked against the
        manifest's size and SHA-256, then read."""
        folder = self.folder(step)
        path = os.path.join(folder, MANIFEST)
        try:
            with open(path, "rb") as handle:
                manifest = json.loads(handle.read())
        except FileNotFoundError:
            raise UserError(f"{path}: missing") from None
        except OSError as error:
            raise UserError(f"{path}: unreadable checkpoint manifest ({os_error_text(error)})") from None
        except ValueError as error:
            raise UserError(f"{path}: unreadable checkpoint manifest ({type(error).__name__}: {error})") from None
        _check_manifest(path, manifest, step)
        for entry in manifest["shards"]:
            _check_shard_file(folder, entry)
        checkpoint = Checkpoint(folder, manifest)
        for rank in range(manifest["world_size"]):
            checkpoint.shard(rank)
        return checkpoint

    def load_latest(self, say: Callable[[str], None] | None = None) -> Checkpoint:
        """The newest intact checkpoint: the one `latest` names, or when that one is damaged the newest
        complete one before it, with one line (through `say`, stderr by default) saying which and
        what was wrong with the newest one skipped."""
        say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.check_folder()
        try:
            named = self.latest_step()
            pointer_problem = None if named is not None else f"{self.pointer}: missing"
        except UserError as error:
            named, pointer_problem = None, str(error)
        # a pointer naming a folder that is gone (a lower step too) leaves every complete one a candidate
        gone = named is not None and not os.path.isdir(self.folder(named))
        candidates = [step for step in reversed(self.complete_steps()) if named is None or gone or step < named]
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


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def has_checkpoints(out_dir: str) -> bool:
    return bool(CheckpointDir(out_dir).steps())


def describe(manifest: dict) -> str:
    """How a checkpoint's run is named in messages: 'a pipeline run of model tiny' and the like."""
    kind = "a pipeline run" if manifest.get("strategy") else "a single-device run"
    return f"{kind} of model '{manifest['model_config']['name']}'"


def json_value(value: Any) -> Any:
    """`value` as JSON keeps it (tuples become lists), for comparing a manifest's fields."""
    return json.loads(json.dumps(value))
