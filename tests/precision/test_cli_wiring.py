"""The subcommands plug into any argparse-based `ditorch` command line."""

from __future__ import annotations

import argparse
import json

from h2.cli.ditorch import add_precision_diff_parser, add_replay_parser


def build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ditorch")
    commands = parser.add_subparsers(dest="command", required=True)
    add_precision_diff_parser(commands)
    add_replay_parser(commands)
    return parser


def test_precision_diff_subcommand_runs_and_turns_user_errors_into_exit_2(tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    log.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    args = build().parse_args(["precision-diff", "--reference", str(log), "--candidate", str(log)])
    assert args.run(args) == 0
    args = build().parse_args(["precision-diff", "--reference", str(log), "--candidate", str(tmp_path / "x")])
    assert args.run(args) == 2
    assert capsys.readouterr().err.startswith("ditorch precision-diff: error: ")


def test_replay_subcommand_is_registered(tmp_path, capsys):
    args = build().parse_args(["replay", str(tmp_path), "--device", "cpu"])
    assert args.run(args) == 2
    assert "holds no captured op calls" in capsys.readouterr().err


def test_ditorch_command_line_has_precision_diff_and_replay(tmp_path, capsys):
    from h2.cli.ditorch import main as ditorch

    reference, perturbed = tmp_path / "r.jsonl", tmp_path / "p.csv"
    reference.write_text("".join(json.dumps({"step": s, "loss": 3.0 - 0.01 * s}) + "\n" for s in range(1, 31)))
    perturbed.write_text("step,loss\n" + "".join(f"{s},{(3.0 - 0.01 * s) * 1.02}\n" for s in range(1, 31)))
    assert ditorch(["precision-diff", "--reference", str(reference), "--candidate", str(reference)]) == 0
    assert "PASS: MRE 0.0000%" in capsys.readouterr().out
    assert ditorch(["precision-diff", "--reference", str(reference), "--candidate", str(perturbed)]) == 1
    assert "FAIL: MRE 2.0000%" in capsys.readouterr().out
    assert ditorch(["precision-diff", "--reference", str(reference), "--candidate", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("ditorch precision-diff: error:")
    assert ditorch(["precision-diff", "--reference", str(reference)]) == 2
    assert "--candidate" in capsys.readouterr().err
    assert ditorch(["replay", str(tmp_path)]) == 2
    assert "holds no captured op calls" in capsys.readouterr().err
