"""Capture saves selected calls (forward and backward) with metadata; replay reruns and compares."""

from __future__ import annotations

import json
import os

import torch

from conftest import build_tiny, tiny_batch, training_step
from ditorch.op_tools import OpCapture
from h2.cli.ditorch import main as ditorch

MODULE = "h2.cli.ditorch"


def replay(argv: list[str]) -> int:
    return ditorch(["replay", *argv])


def in_first_layer(call) -> bool:
    return call.module.startswith("Transformer.layers.0.")


def capture_mm(tmp_path, **options) -> OpCapture:
    model, tokens = build_tiny(), tiny_batch()
    with OpCapture(str(tmp_path / "capture"), "mm", predicate=in_first_layer, report=None, **options) as capture:
        training_step(model, tokens)
    return capture


def test_capture_saves_forward_and_backward_calls_with_metadata(tmp_path):
    capture = capture_mm(tmp_path)
    assert len(capture.saved) == 7 + 14  # 7 linear layers: one mm each forward, two each in backward
    metas = [json.load(open(os.path.join(folder, "meta.json"))) for folder in capture.saved]
    assert {m["phase"] for m in metas} == {"forward", "backward"}
    first = metas[0]
    assert first["op"] == "aten.mm.default" and first["module"] == "Transformer.layers.0.attn.q_proj"
    assert first["device"] == "cpu" and first["inputs"] == "f32[32,64] f32[64,64]"
    saved = torch.load(os.path.join(capture.saved[0], "call.pt"), weights_only=True)
    a, b = saved["args"]
    assert torch.equal(saved["outputs"], a @ b)


def test_max_calls_limits_what_is_saved(tmp_path):
    assert len(capture_mm(tmp_path, max_calls=3).saved) == 3


def test_replay_on_cpu_matches_the_capture(tmp_path, capsys):
    capture_mm(tmp_path, max_calls=5)
    assert replay([str(tmp_path / "capture"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "replayed 5 op calls on cpu: 5 match, 0 differ or failed" in out


def test_replay_reports_a_changed_output_with_exit_1(tmp_path, capsys):
    capture = capture_mm(tmp_path, max_calls=2)
    path = os.path.join(capture.saved[1], "call.pt")
    saved = torch.load(path, weights_only=True)
    saved["outputs"] = saved["outputs"] * 1.001
    torch.save(saved, path)
    assert replay([str(tmp_path / "capture")]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "1 differ or failed" in out
    assert replay([capture.saved[0]]) == 0  # one call folder on its own


def test_replay_captured_in_place_op_with_memory_format_argument(tmp_path, capsys):
    x = torch.randn(3, 3)
    with OpCapture(str(tmp_path / "c"), ["add_", "clone"], report=None) as capture:
        x.add_(1.0)
        x.clone(memory_format=torch.contiguous_format)
    assert len(capture.saved) == 2
    assert replay([str(tmp_path / "c")]) == 0
    assert "replayed 2 op calls on cpu: 2 match, 0 differ or failed" in capsys.readouterr().out


def test_bad_capture_folders_are_rejected_with_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert replay([str(empty)]) == 2 and "holds no captured op calls" in capsys.readouterr().err
    broken = empty / "000000_mm_forward"
    broken.mkdir()
    (broken / "meta.json").write_text('{"format": 1, "op": "aten.nonexistent_op.default"}')
    (broken / "call.pt").write_bytes(b"not a torch file")
    assert replay([str(empty)]) == 2 and "call.pt: cannot load" in capsys.readouterr().err
    torch.save({"args": (), "kwargs": {}, "outputs": None}, broken / "call.pt")
    assert replay([str(empty)]) == 2 and "no operator aten.nonexistent_op.default" in capsys.readouterr().err
    assert replay([str(tmp_path / "missing")]) == 2 and "no such folder" in capsys.readouterr().err
    (broken / "meta.json").write_text('{"format": 1, "op": "aten.mm.default"}')
    assert replay([str(empty), "--device", "nosuchdevice"]) == 2
    assert "--device nosuchdevice" in capsys.readouterr().err


def test_bad_input_is_one_line_without_traceback_from_the_command_line(tmp_path, cli):
    result = cli(MODULE, "replay", str(tmp_path / "missing"))
    assert result.returncode == 2 and "no such folder" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
