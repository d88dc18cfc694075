"""`ditorch precision-diff`: the paper's MRE over aligned steps; exit 0 pass, 1 fail, 2 bad input."""

from __future__ import annotations

import json
import math
import os

import pytest

from ditorch.precision.loss_diff import compare_losses
from ditorch.precision.loss_log import read_loss_log
from h2.cli.ditorch import main as ditorch
from h2.core.errors import UserError

MODULE = "h2.cli.ditorch"


def precision_diff(argv: list[str]) -> int:
    return ditorch(["precision-diff", *argv])


def loss_curve(steps: int) -> list[tuple[int, float]]:
    return [(step, 5.0 * math.exp(-step / 40) + 1.5 + 0.05 * math.sin(step)) for step in range(1, steps + 1)]


def write_jsonl(path, records, extra=True) -> str:
    with open(path, "w") as handle:
        for step, loss in records:
            record = {"step": step, "loss": loss, "lr": 1e-3} if extra else {"step": step, "loss": loss}
            handle.write(json.dumps(record) + "\n")
    return str(path)


def write_csv(path, records, header=True) -> str:
    with open(path, "w") as handle:
        if header:
            handle.write("step,loss\n")
        handle.writelines(f"{step},{loss!r}\n" for step, loss in records)
    return str(path)


@pytest.fixture
def reference(tmp_path) -> str:
    return write_jsonl(tmp_path / "reference.jsonl", loss_curve(120))


def test_identical_logs_pass_with_mre_zero(reference, capsys):
    assert precision_diff(["--reference", reference, "--candidate", reference, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mre"] == 0.0 and result["max_relative_error"] == 0.0 and result["passed"]
    assert result["steps"] == 120


def test_log_perturbed_by_two_percent_fails_with_exit_1(reference, tmp_path, capsys):
    candidate = write_csv(tmp_path / "candidate.csv", [(s, loss * 1.02) for s, loss in loss_curve(120)])
    assert precision_diff(["--reference", reference, "--candidate", candidate]) == 1
    out = capsys.readouterr().out
    assert "MRE 2.0000%" in out and "FAIL" in out


def test_mre_is_mean_of_absolute_relative_errors(tmp_path):
    ref = write_csv(tmp_path / "r.csv", [(1, 2.0), (2, 4.0), (3, 5.0), (4, 10.0)])
    cand = write_csv(tmp_path / "c.csv", [(1, 2.02), (2, 3.96), (3, 5.0), (4, 10.3)])
    diff = compare_losses(read_loss_log(ref), read_loss_log(cand), window=2)
    assert diff.mre == pytest.approx((0.01 + 0.01 + 0.0 + 0.03) / 4)
    assert diff.max_relative_error == pytest.approx(0.03) and diff.max_error_step == 4
    assert [(w.first_step, w.last_step) for w in diff.windows] == [(1, 2), (3, 4)]
    assert diff.windows[0].mean_signed_error == pytest.approx(0.0)
    assert diff.windows[1].mre == pytest.approx(0.015)


def test_threshold_is_strict_and_overridable(reference, tmp_path):
    candidate = write_jsonl(tmp_path / "c.jsonl", [(s, loss * 1.01) for s, loss in loss_curve(120)])
    assert precision_diff(["--reference", reference, "--candidate", candidate]) == 0
    assert precision_diff(["--reference", reference, "--candidate", candidate, "--threshold", "0.005"]) == 1


def test_steps_compares_only_the_first_n_reference_steps(reference, tmp_path, capsys):
    records = loss_curve(120)
    candidate = write_jsonl(tmp_path / "c.jsonl", records[:60] + [(s, loss * 2) for s, loss in records[60:]])
    assert precision_diff(["--reference", reference, "--candidate", candidate, "--steps", "60", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_step"] == 60
    assert precision_diff(["--reference", reference, "--candidate", candidate]) == 1


def test_run_folder_of_the_h2_trainer_is_accepted(tmp_path, capsys):
    from h2.core.model_config import preset
    from h2.train import TrainConfig
    from h2.train.trainer import train

    run = tmp_path / "run"
    train(preset("tiny"), TrainConfig(steps=2, seq_len=16, micro_batch_size=2), str(run), show_progress=False)
    assert precision_diff(["--reference", str(run), "--candidate", str(run / "metrics.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "aligned steps 1..2 (2 steps)" in out and "PASS: MRE 0.0000%" in out


def test_plot_is_a_png_file(reference, tmp_path):
    candidate = write_csv(tmp_path / "c.csv", [(s, loss * 1.003) for s, loss in loss_curve(120)], header=False)
    plot = tmp_path / "plots" / "diff.png"
    assert precision_diff(["--reference", reference, "--candidate", candidate, "--plot", str(plot)]) == 0
    with open(plot, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(plot) > 10_000


@pytest.mark.parametrize("content, message", [
    ('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": NaN}\n', "loss is nan at step 2 (non-finite)"),
    ('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": Infinity}\n', "loss is inf at step 2 (non-finite)"),
    ('{"step": 1, "loss": 3.0}\n{"step": 2, "los": 3.0}\n', ":2: field 'loss' missing"),
    ('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 3.0\n', ":2: not valid JSON"),
    ('{"step": 1, "loss": 3.0}\n{"step": 1, "loss": 3.0}\n', ":2: step 1 appears twice (first on line 1)"),
    ('{"step": "one", "loss": 3.0}\n', ":1: step 'one' is not an integer"),
    ('{"step": 1, "loss": "low"}\n', ":1: loss 'low' is not a number"),
    ("", ": no loss records"),
])
def test_malformed_candidate_is_rejected_with_exit_2_and_one_line(tmp_path, content, message, cli):
    reference = write_jsonl(tmp_path / "r.jsonl", [(1, 3.0), (2, 3.0)])
    candidate = tmp_path / "bad.jsonl"
    candidate.write_text(content)
    result = cli(MODULE, "precision-diff", "--reference", reference, "--candidate", str(candidate))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert str(candidate) in result.stderr and message in result.stderr


def test_missing_steps_are_named(reference, tmp_path):
    candidate = write_jsonl(tmp_path / "c.jsonl", [(s, loss) for s, loss in loss_curve(120) if s not in (7, 9)])
    with pytest.raises(UserError, match=r"missing 2 of the reference's 120 steps \(steps 7, 9\)"):
        compare_losses(read_loss_log(reference), read_loss_log(candidate))


def test_steps_beyond_the_reference_are_rejected(reference):
    with pytest.raises(UserError, match="--steps 500 asked, but the reference has only 120 steps"):
        compare_losses(read_loss_log(reference), read_loss_log(reference), steps=500)


def test_csv_header_must_name_step_and_loss(tmp_path, reference):
    candidate = tmp_path / "c.csv"
    candidate.write_text("when,value\n1,3.0\n")
    with pytest.raises(UserError, match="CSV header has no 'step' column"):
        read_loss_log(str(candidate))


def test_csv_with_extra_columns_uses_the_named_ones(tmp_path):
    log = tmp_path / "c.csv"
    log.write_text("lr,loss,step\n0.1,3.5,1\n0.1,3.25,2\n")
    assert read_loss_log(str(log)).losses == {1: 3.5, 2: 3.25}


def test_folder_without_metrics_and_missing_file_are_bad_input(tmp_path, reference, capsys):
    assert precision_diff(["--reference", reference, "--candidate", str(tmp_path)]) == 2
    assert "a folder without metrics.jsonl" in capsys.readouterr().err
    assert precision_diff(["--reference", str(tmp_path / "none.jsonl"), "--candidate", reference]) == 2
    assert "none.jsonl: no such file or folder" in capsys.readouterr().err


def test_binary_file_is_bad_input(tmp_path, reference, capsys):
    blob = tmp_path / "blob.csv"
    blob.write_bytes(b"\xff\xfe\x00\x81" * 10)
    assert precision_diff(["--reference", reference, "--candidate", str(blob)]) == 2
    assert "not a text file" in capsys.readouterr().err


def test_non_finite_loss_outside_the_compared_steps_is_ignored(tmp_path, reference, capsys):
    records = loss_curve(120)
    candidate = write_jsonl(tmp_path / "c.jsonl", records[:50] + [(51, float("nan"))])
    assert precision_diff(["--reference", reference, "--candidate", candidate, "--steps", "50", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["first_step"], result["last_step"], result["steps"]) == (1, 50, 50)
    assert result["passed"] and result["mre"] == 0.0 and result["max_relative_error"] == 0.0


def test_zero_reference_loss_is_bad_input(tmp_path):
    ref = write_csv(tmp_path / "r.csv", [(1, 0.0)])
    with pytest.raises(UserError, match="reference loss is 0 at step 1"):
        compare_losses(read_loss_log(ref), read_loss_log(ref))


@pytest.mark.parametrize("flag, value", [("--threshold", "0"), ("--steps", "0"), ("--window", "0")])
def test_out_of_range_options_are_bad_input(reference, flag, value, capsys):
    assert precision_diff(["--reference", reference, "--candidate", reference, flag, value]) == 2
    assert flag in capsys.readouterr().err
