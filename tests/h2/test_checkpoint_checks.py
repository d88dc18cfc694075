"""Checked checkpoints: every damaged or mismatched checkpoint is skipped for the newest intact one
before it, with one line naming what was wrong, or refused in one line when none is intact; the
resumed run's losses equal the uninterrupted run's. Nothing is unpickled on load."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil

import pytest

from h2.core.errors import UserError
from h2.model import preset
from h2.train import TrainConfig, Trainer
from h2.train.checkpoint import FORMAT, MANIFEST, CheckpointDir, shard_name
from h2.train.metrics import read_metrics

STEPS = 6


def train(out, corpus, steps, resume=False):
    config = TrainConfig(steps=steps, micro_batch_size=2, seq_len=32, warmup_steps=1, checkpoint_every=1,
                         keep_checkpoints=5, lr_decay_steps=STEPS)
    trainer = Trainer(preset("tiny"), config, str(out), resume=resume, corpus=corpus, show_progress=False)
    trainer.run()
    return trainer


def losses(out) -> list[float]:
    return [record["loss"] for record in read_metrics(os.path.join(out, "metrics.jsonl"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """A run checkpointed at steps 1..4, and the same run uninterrupted to step 6."""
    root = tmp_path_factory.mktemp("runs")
    train(root / "straight", corpus, STEPS)
    train(root / "stopped", corpus, 4)
    return root


@pytest.fixture
def out(runs, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(runs / "stopped", copy)
    return copy


def step_folder(out, step: int):
    return out / "checkpoints" / f"step_{step:08d}"


def shard(out, step: int):
    return step_folder(out, step) / shard_name(0)


def zero_4k_inside(out):
    path = shard(out, 4)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def copy_step_3_into_step_4(out):
    shutil.copy(shard(out, 3), shard(out, 4))


def flip_a_bit_that_keeps_the_json(out):
    """A digit of the recorded elapsed time changes (bit 0 of an ASCII digit is another digit)."""
    path = step_folder(out, 4) / MANIFEST
    text = path.read_bytes()
    at = text.index(b'"elapsed_s": ') + len(b'"elapsed_s": ') + 2
    path.write_bytes(text[:at] + bytes([text[at] ^ 1]) + text[at + 1:])
    json.loads(path.read_bytes())  # still JSON: only the manifest's own digest sees the change


def flip_a_bit_in_the_middle(out):
    path = step_folder(out, 4) / MANIFEST
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def remove_the_shard(out):
    os.remove(shard(out, 4))


def cut_the_shard_short(out):
    path = shard(out, 4)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def point_latest_nowhere(out):
    (out / "checkpoints" / "latest").write_text("step_00000099\n")


def point_latest_below_every_checkpoint(out):
    (out / "checkpoints" / "latest").write_text("step_00000000\n")  # a step that is gone (found by the campaign)


def point_latest_at_an_empty_folder(out):
    os.makedirs(step_folder(out, 9))
    (out / "checkpoints" / "latest").write_text("step_00000009\n")


DAMAGE = {
    zero_4k_inside: r"rank_00000.safetensors: its SHA-256 differs from the manifest's",
    copy_step_3_into_step_4: r"step_00000004/rank_00000.safetensors: its SHA-256 differs from the manifest's",
    flip_a_bit_that_keeps_the_json: r"manifest.json: damaged \(its content does not match its manifest_sha256\)",
    flip_a_bit_in_the_middle: r"manifest.json: (damaged|unreadable checkpoint manifest)",
    remove_the_shard: r"rank_00000.safetensors: listed in manifest.json but missing",
    cut_the_shard_short: r"rank_00000.safetensors: \d+ bytes, the manifest says \d+ \(cut short or replaced\)",
    point_latest_nowhere: r"step_00000099/manifest.json: missing",
    point_latest_at_an_empty_folder: r"step_00000009/manifest.json: missing",
    point_latest_below_every_checkpoint: r"step_00000000/manifest.json: missing",
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=[damage.__name__ for damage in DAMAGE])
def test_a_damaged_checkpoint_is_skipped_with_one_line_and_the_resumed_losses_equal_the_straight_run(
        damage, runs, out, corpus, capfd):
    expected_step = 3 if damage.__name__ not in ("point_latest_nowhere", "point_latest_at_an_empty_folder",
                                                 "point_latest_below_every_checkpoint") else 4
    damage(out)
    capfd.readouterr()
    trainer = Trainer(
        preset("tiny"),
        TrainConfig(steps=STEPS, micro_batch_size=2, seq_len=32, warmup_steps=1, checkpoint_every=1,
                    keep_checkpoints=5), str(out), resume=True, corpus=corpus, show_progress=False)
    lines = [line for line in capfd.readouterr().err.splitlines() if "resuming from" in line]
    assert trainer.step == expected_step
    assert len(lines) == 1 and f"step_{expected_step:08d}, the newest intact checkpoint" in lines[0], lines
    assert re.search(DAMAGE[damage], lines[0]), lines[0]
    trainer.run()
    assert losses(out) == losses(runs / "straight")


def test_checkpoints_replaced_by_a_file_is_one_line(out, corpus):
    shutil.rmtree(out / "checkpoints")
    (out / "checkpoints").write_text("not a folder")
    for resume in (True, False):
        with pytest.raises(UserError, match=r"checkpoints: exists and is not a folder"):
            train(out, corpus, STEPS, resume=resume)


def test_resume_in_an_empty_folder_is_one_line(tmp_path, corpus):
    with pytest.raises(UserError, match=r"checkpoints: no checkpoint to resume from"):
        train(tmp_path, corpus, 2, resume=True)
    os.makedirs(tmp_path / "checkpoints")
    with pytest.raises(UserError, match=r"checkpoints: no checkpoint to resume from"):
        train(tmp_path, corpus, 2, resume=True)


def test_every_checkpoint_damaged_is_one_line_naming_the_newest(out, corpus):
    for step in range(1, 5):
        shard(out, step).write_bytes(bytes(shard(out, step).stat().st_size))  # zeroed whole
    with pytest.raises(
            UserError, match=r"no intact checkpoint \(4 unusable; newest: .*step_00000004/rank_00000"
            r".safetensors: its SHA-256 differs"):
        train(out, corpus, STEPS, resume=True)


def test_the_manifest_lists_every_shard_with_its_size_and_sha256(out):
    from h2.train.checkpoint import manifest_digest

    manifest = json.loads((step_folder(out, 4) / MANIFEST).read_text())
    data = shard(out, 4).read_bytes()
    assert manifest["format"] == FORMAT == "h2-checkpoint-2"
    assert manifest["shards"] == [{
        "file": "rank_00000.safetensors", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()
    }]
    assert manifest["manifest_sha256"] == manifest_digest(manifest)
    assert sorted(os.listdir(step_folder(out, 4))) == [MANIFEST, "rank_00000.safetensors"]


def test_a_shard_is_a_safetensors_file_with_its_parts_named(out):
    from safetensors import safe_open

    with safe_open(str(shard(out, 4)), framework="pt") as handle:
        keys, meta = set(handle.keys()), json.loads(handle.metadata()["h2"])
    assert "parameters/embed.weight" in keys and "optimizer/embed.weight/exp_avg" in keys and "rng/torch" in keys
    assert (meta["format"], meta["step"], meta["rank"]) == (FORMAT, 4, 0)
    assert meta["fields"]["layout"]["embed.weight"] == {"dim": None, "index": 0, "parts": 1}


class RunsCode:
    """A pickle that, when unpickled, writes a file: the proof that something unpickled it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')", ))


def tamper(out, tmp_path, *, earlier_format: bool) -> str:
    """Step 4's shard replaced by a pickle that runs code (its manifest made consistent with it, as an
    attacker would); with `earlier_format`, as the checkpoint of format 1 it pretends to be."""
    from h2.train.checkpoint import manifest_digest

    marker = str(tmp_path / "code-ran")
    folder = step_folder(out, 4)
    payload = pickle.dumps({"parameters": RunsCode(marker)})
    name = "rank_00000.pt" if earlier_format else shard_name(0)
    os.remove(shard(out, 4))
    (folder / name).write_bytes(payload)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["shards"] = [{"file": name, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}]
    if earlier_format:
        manifest = {key: value for key, value in manifest.items() if key not in ("shards", "manifest_sha256")}
        manifest["format"] = "h2-checkpoint-1"
    else:
        manifest["manifest_sha256"] = manifest_digest(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return marker


@pytest.mark.parametrize("earlier_format", [False, True], ids=["as-safetensors", "as-format-1-pt"])
def test_a_tampered_pickle_is_refused_in_one_line_and_never_runs(out, tmp_path, earlier_format):
    marker = tamper(out, tmp_path, earlier_format=earlier_format)
    with pytest.raises(UserError) as refused:
        CheckpointDir(str(out)).load(4)
    message = str(refused.value)
    assert "\n" not in message and not os.path.exists(marker), message
    if earlier_format:
        assert "manifest.json: a checkpoint of the earlier format h2-checkpoint-1, not loaded" in message
    else:
        assert "rank_00000.safetensors: unreadable checkpoint shard" in message
    assert CheckpointDir(str(out)).load_latest(say=lambda line: None).step == 3
    assert not os.path.exists(marker)
