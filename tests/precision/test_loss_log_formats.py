"""`ditorch precision-diff` reads the reference where users keep it: Megatron-LM, torchtitan and
nanoGPT logs, TensorBoard event files, W&B exports and plain CSV/JSONL; it aligns by step or by
consumed tokens. The fixture logs are written here in each framework's documented line format."""

from __future__ import annotations

import json
import math
import struct

import pytest

from ditorch.precision.loss_diff import compare_losses
from ditorch.precision.loss_log import read_loss_log
from h2.cli.ditorch import main as ditorch
from h2.core.errors import UserError


def curve(steps: int, first: int = 1) -> list[tuple[int, float]]:
    return [(s, round(8.0 * math.exp(-s / 30) + 2.0 + 0.01 * (s % 7), 6)) for s in range(first, first + steps)]


def precision_diff(*argv: str) -> int:
    return ditorch(["precision-diff", *argv])


# ---- fixture writers, one per format --------------------------------------------------------------
def megatron_log(path, records, seq_length: int | None = 1024, global_batch: int = 8, loss_name="lm loss"):
    lines = [
        "using world size: 8, data-parallel size: 8, tensor-model-parallel size: 1",
        "------------------------ arguments ------------------------",
        "  micro_batch_size ................................ 1"
    ]
    if seq_length is not None:
        lines.append(f"  seq_length ...................................... {seq_length}")
    lines += ["-------------------- end of arguments ---------------------", "[after dataloaders are built] ..."]
    for step, loss in records:
        lines.append(f" [2024-05-01 10:{step // 60:02d}:{step % 60:02d}] iteration {step:8d}/{500:8d} | "
                     f"consumed samples: {step * global_batch:12d} | elapsed time per iteration (ms): 812.4 | "
                     f"learning rate: 3.000000E-04 | global batch size: {global_batch:5d} | "
                     f"{loss_name}: {loss:.6E} | loss scale: 1.0 | grad norm: 1.234 | "
                     f"number of skipped iterations:   0 | number of nan iterations:   0 |")
    lines.append(" validation loss at iteration 10 | lm loss value: 9.999999E+00 | lm loss PPL: 2.2E+04 |")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


COLOURS = ["\x1b[31m", "\x1b[32m", "\x1b[38;2;180;60;0m", "\x1b[36m", "\x1b[34m", "\x1b[35m", "\x1b[39m"]


def torchtitan_log(path, records, global_batch: int = 16, seq_len: int = 256):
    red, green, orange, cyan, blue, magenta, reset = COLOURS
    prefix = "[rank0]:[titan] 2025-03-01 12:00:00,000 - root - INFO - "
    lines = [
        prefix + "Building llama3 debugmodel with {...}",
        prefix + f"Training starts at step 1, with local batch size 8, global batch size {global_batch}, "
        f"sequence length {seq_len}, total steps 100 (warmup 2)"
    ]
    for step, loss in records:
        lines.append(prefix + f"{red}step: {step:2}  {green}loss: {loss:7.4f}  {orange}grad_norm:  1.2345  "
                     f"{cyan}memory:  1.20GiB(1.26%)  {blue}tps: 12,345  {cyan}tflops: 0.12  "
                     f"{magenta}mfu: 0.01%{reset}")
        if step % 10 == 0:
            lines.append(prefix + f"{red}validate step: {step:2}  {green}loss: 99.0000  {blue}tps: 1,000{reset}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def nanogpt_log(path, records, tokens_per_iter: int = 491_520):
    lines = [
        f"tokens per iteration will be: {tokens_per_iter:,}", "Initializing a new model from scratch",
        "number of parameters: 123.59M", "compiling the model... (takes a ~minute)"
    ]
    for step, loss in records:
        if step % 10 == 0:
            lines.append(f"step {step}: train loss {loss + 0.5:.4f}, val loss {loss + 0.6:.4f}")
        lines.append(f"iter {step}: loss {loss:.4f}, time {1234.56:.2f}ms, mfu {-100.0:.2f}%")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def tensorboard_run(folder, records, tag="train/loss", tokens_per_step=None):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step, loss in records:
        writer.add_scalar(tag, loss, step)
        writer.add_scalar("lr", 3e-4, step)
        if tokens_per_step:
            writer.add_scalar("ntokens_seen", step * tokens_per_step, step)
    writer.close()
    return str(folder)


def tf2_tensor_events(folder, records, tag="loss"):
    """Scalars as TF2's tf.summary.scalar writes them: a TensorProto, not a simple_value."""
    from tensorboardX.event_file_writer import EventFileWriter
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.proto.tensor_pb2 import TensorProto

    writer = EventFileWriter(str(folder))
    for step, loss in records:
        tensor = TensorProto(dtype=2, tensor_content=struct.pack("<d", loss)) if step % 2 else \
            TensorProto(dtype=1, float_val=[loss])
        writer.add_event(Event(step=step, wall_time=1.0,
                               summary=Summary(value=[Summary.Value(tag=tag, tensor=tensor)])))
    writer.close()
    return str(folder)


def event_file(folder) -> str:
    return str(next(p for p in folder.iterdir() if "tfevents" in p.name))


def wandb_panel_csv(path, runs: dict[str, list[tuple[int, float]]], metric="train/loss"):
    header = ["Step"] + [f"{run} - {metric}{band}" for run in runs for band in ("", "__MIN", "__MAX")]
    steps = sorted({s for records in runs.values() for s, _ in records})
    rows = [",".join(f'"{h}"' for h in header)]
    for step in steps:
        cells = [str(step)]
        for records in runs.values():
            value = dict(records).get(step)
            cells += [repr(value) if value is not None else ""] * 3
        rows.append(",".join(cells))
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def wandb_history_jsonl(path, records):
    lines = []
    for step, loss in records:
        lines.append(json.dumps({"_step": step, "_runtime": step * 0.5, "train/loss": loss, "_timestamp": 1.7e9}))
        lines.append(json.dumps({"_step": step, "_runtime": step * 0.5, "eval/accuracy": 0.5}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ---- each format --------------------------------------------------------------------------------------
def test_megatron_log_gives_the_lm_loss_of_each_iteration_line(tmp_path):
    records = curve(20)
    log = read_loss_log(megatron_log(tmp_path / "megatron.log", records))
    assert log.format == "megatron" and log.losses == {s: pytest.approx(v, rel=1e-6) for s, v in records}


def test_megatron_consumed_tokens_are_consumed_samples_times_seq_length(tmp_path):
    log = read_loss_log(megatron_log(tmp_path / "megatron.log", curve(5), seq_length=2048, global_batch=4))
    assert log.consumed_tokens(3, "reference") == 3 * 4 * 2048


def test_megatron_log_without_its_arguments_block_cannot_align_by_tokens(tmp_path):
    log = read_loss_log(megatron_log(tmp_path / "megatron.log", curve(5), seq_length=None))
    with pytest.raises(UserError, match="does not state; pass --reference-tokens-per-step N"):
        log.consumed_tokens(1, "reference")


def test_torchtitan_log_gives_training_steps_through_colour_codes_and_skips_validation(tmp_path):
    records = curve(25)
    log = read_loss_log(torchtitan_log(tmp_path / "titan.log", records))
    assert log.format == "torchtitan" and log.losses == {s: round(v, 4) for s, v in records}


def test_torchtitan_tokens_per_step_come_from_its_training_starts_line(tmp_path):
    log = read_loss_log(torchtitan_log(tmp_path / "titan.log", curve(3), global_batch=16, seq_len=256))
    assert log.tokens_per_step == 16 * 256


def test_nanogpt_stdout_gives_iter_losses_not_eval_lines(tmp_path):
    records = curve(21, first=0)
    log = read_loss_log(nanogpt_log(tmp_path / "train.out", records))
    assert log.format == "nanogpt" and log.losses == {s: round(v, 4) for s, v in records}


def test_nanogpt_counts_tokens_from_iteration_zero(tmp_path):
    log = read_loss_log(nanogpt_log(tmp_path / "train.out", curve(3, first=0), tokens_per_iter=1000))
    assert [log.consumed_tokens(s, "candidate") for s in (0, 1, 2)] == [1000, 2000, 3000]


def test_tensorboard_event_file_scalars_are_read(tmp_path):
    records = curve(12)
    log = read_loss_log(event_file(tmp_path) if tensorboard_run(tmp_path, records) else "")
    assert log.format == "tensorboard" and log.losses == {s: pytest.approx(v, rel=1e-6) for s, v in records}


def test_tensorboard_tensor_scalars_as_tf2_writes_them_are_read(tmp_path):
    records = curve(6)
    log = read_loss_log(tf2_tensor_events(tmp_path, records))
    assert log.losses == {s: pytest.approx(v, rel=1e-6) for s, v in records}


def test_tensorboard_run_folder_takes_tokens_from_the_ntokens_seen_tag(tmp_path):
    log = read_loss_log(tensorboard_run(tmp_path / "tb" / "20250301-1200", curve(4), tokens_per_step=512))
    assert log.tokens == {1: 512, 2: 1024, 3: 1536, 4: 2048}


def test_tensorboard_restarted_run_keeps_the_values_written_after_the_restart(tmp_path):
    from tensorboardX import SummaryWriter

    first = SummaryWriter(str(tmp_path), filename_suffix=".a")
    for step in range(1, 6):
        first.add_scalar("loss", 10.0, step)
    first.close()
    second = SummaryWriter(str(tmp_path), filename_suffix=".b")
    for step in range(4, 8):
        second.add_scalar("loss", 5.0, step)
    second.close()
    assert read_loss_log(str(tmp_path)).losses == {1: 10.0, 2: 10.0, 3: 10.0, 4: 5.0, 5: 5.0, 6: 5.0, 7: 5.0}


def test_tensorboard_folder_holding_two_runs_is_refused(tmp_path):
    tensorboard_run(tmp_path / "run_a", curve(2))
    tensorboard_run(tmp_path / "run_b", curve(2))
    with pytest.raises(UserError, match="holds the event files of 2 runs"):
        read_loss_log(str(tmp_path))


def test_corrupt_event_file_is_named(tmp_path):
    path = event_file(tmp_path) if tensorboard_run(tmp_path, curve(3)) else ""
    data = bytearray(open(path, "rb").read())
    data[-30] ^= 0xFF  # inside the last record's payload
    open(path, "wb").write(bytes(data))
    with pytest.raises(UserError, match="corrupt event file"):
        read_loss_log(path)


def test_event_file_cut_mid_record_keeps_the_complete_records(tmp_path):
    path = event_file(tmp_path) if tf2_tensor_events(tmp_path, curve(5)) else ""
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-10])
    assert sorted(read_loss_log(path).losses) == [1, 2, 3, 4]


def test_wandb_panel_csv_uses_the_run_column_not_its_min_max_band(tmp_path):
    records = curve(10)
    log = read_loss_log(wandb_panel_csv(tmp_path / "wandb.csv", {"a100-ref": records}))
    assert log.losses == {s: pytest.approx(v) for s, v in records}


def test_wandb_panel_csv_with_two_runs_needs_the_column_named(tmp_path):
    path = wandb_panel_csv(tmp_path / "wandb.csv", {"a100-ref": curve(5), "chip-x": curve(5)})
    with pytest.raises(UserError, match="several loss columns"):
        read_loss_log(path)
    assert read_loss_log(path, key="chip-x - train/loss").steps == [1, 2, 3, 4, 5]


def test_wandb_history_jsonl_skips_rows_that_logged_other_metrics(tmp_path):
    records = curve(6, first=0)
    log = read_loss_log(wandb_history_jsonl(tmp_path / "wandb-history.jsonl", records))
    assert log.losses == {s: pytest.approx(v) for s, v in records}


def test_generic_csv_with_iteration_and_lm_loss_columns(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("iteration,lm loss,lr\n1,7.5,0.1\n2,7.25,0.1\n")
    assert read_loss_log(str(path)).losses == {1: 7.5, 2: 7.25}


def test_h2_metrics_count_tokens_per_step_into_consumed_tokens(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(
        json.dumps({"step": s, "loss": 3.0, "lr": 0.1, "tokens": 100, "tokens_per_s": 1.0, "step_time_s": 1.0}) + "\n"
        for s in (1, 2, 3)))
    log = read_loss_log(str(path))
    assert log.format == "h2" and log.tokens == {1: 100, 2: 200, 3: 300}


@pytest.mark.parametrize("writer, expected", [
    (lambda p: megatron_log(p / "log.txt", curve(3)), "megatron"),
    (lambda p: torchtitan_log(p / "log.txt", curve(3)), "torchtitan"),
    (lambda p: nanogpt_log(p / "log.txt", curve(3, first=0)), "nanogpt"),
    (lambda p: event_file(p) if tensorboard_run(p, curve(3)) else "", "tensorboard"),
    (lambda p: wandb_panel_csv(p / "log.txt", {"r": curve(3)}), "csv"),
    (lambda p: wandb_history_jsonl(p / "log.txt", curve(3)), "jsonl"),
])
def test_the_format_is_recognised_from_the_content(tmp_path, writer, expected):
    assert read_loss_log(writer(tmp_path)).format == expected


def test_format_override_reads_a_log_whose_content_is_ambiguous(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_text("iter 0: loss 5.0, time 1ms\nstep: 1  loss: 4.0\nstep: 2  loss: 3.0\n")
    assert read_loss_log(str(path)).format == "torchtitan"
    assert read_loss_log(str(path), form="nanogpt").losses == {0: 5.0}


def test_unrecognised_text_is_one_line_naming_the_file_and_the_format_flags(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("the run went fine\nloss was low\n")
    reference = megatron_log(tmp_path / "m.log", curve(3))
    assert precision_diff("--reference", reference, "--candidate", str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: not a loss log this reads" in err and "--candidate-format" in err


def test_a_key_the_log_does_not_have_lists_what_it_has(tmp_path):
    path = tensorboard_run(tmp_path, curve(2))
    with pytest.raises(UserError, match=r"no scalar tag named 'lm loss' \(has: train/loss, lr\)"):
        read_loss_log(path, key="lm loss")


# ---- comparing across formats -------------------------------------------------------------------------
def test_megatron_reference_and_h2_candidate_with_the_same_losses_pass(tmp_path, capsys):
    records = curve(30)
    reference = megatron_log(tmp_path / "megatron.log", records)
    candidate = tmp_path / "metrics.jsonl"
    candidate.write_text("".join(json.dumps({"step": s, "loss": float(f"{v:.6E}")}) + "\n" for s, v in records))
    assert precision_diff("--reference", reference, "--candidate", str(candidate), "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mre"] == 0.0 and result["reference_format"] == "megatron"


def test_align_tokens_pairs_steps_that_consumed_the_same_tokens(tmp_path, capsys):
    reference_records = curve(20)  # torchtitan, 16 x 256 = 4096 tokens per step, steps from 1
    candidate_records = []  # nanoGPT, 2048 tokens per iteration, iterations from 0
    for iteration in range(40):
        ends_a_reference_step = (iteration + 1) % 2 == 0
        loss = dict(reference_records)[(iteration + 1) // 2] if ends_a_reference_step else 50.0
        candidate_records.append((iteration, round(loss, 4)))
    reference = torchtitan_log(tmp_path / "titan.log", reference_records, global_batch=16, seq_len=256)
    candidate = nanogpt_log(tmp_path / "nano.out", candidate_records, tokens_per_iter=2048)
    assert precision_diff("--reference", reference, "--candidate", candidate, "--align", "tokens", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["mre"], result["steps"], result["candidate_last_step"]) == (0.0, 20, 39)


def test_align_tokens_takes_tokens_per_step_from_the_flags_where_logs_do_not_say(tmp_path, capsys):
    reference = tmp_path / "r.csv"
    reference.write_text("step,loss\n" + "".join(f"{s},{v}\n" for s, v in curve(10)))
    candidate = tmp_path / "c.csv"
    candidate.write_text("step,loss\n" + "".join(f"{s},{dict(curve(10)).get(s // 4, 9.0)}\n" for s in range(1, 41)))
    assert precision_diff("--reference", str(reference), "--candidate", str(candidate), "--align", "tokens",
                          "--reference-tokens-per-step", "400", "--candidate-tokens-per-step", "100") == 0
    assert "aligned by consumed tokens: 10 of 10 reference steps" in capsys.readouterr().out


def test_align_tokens_without_a_token_count_names_the_missing_flag(tmp_path, capsys):
    log = tmp_path / "r.csv"
    log.write_text("step,loss\n1,3.0\n2,2.9\n")
    assert precision_diff("--reference", str(log), "--candidate", str(log), "--align", "tokens") == 2
    assert "pass --reference-tokens-per-step N" in capsys.readouterr().err


def test_candidate_too_short_in_tokens_is_named(tmp_path):
    reference = read_loss_log(megatron_log(tmp_path / "m.log", curve(10), seq_length=100, global_batch=10))
    candidate = read_loss_log(nanogpt_log(tmp_path / "n.out", curve(5, first=0), tokens_per_iter=1000))
    with pytest.raises(
            UserError, match=r"n.out: the curve ends at 5000 tokens \(step 4\), but the reference's "
            r"10 steps reach 10000 tokens"):
        compare_losses(reference, candidate, align="tokens")


def test_candidate_too_short_in_steps_is_named(tmp_path):
    reference = read_loss_log(megatron_log(tmp_path / "m.log", curve(120)))
    candidate = read_loss_log(torchtitan_log(tmp_path / "t.log", curve(50)))
    with pytest.raises(UserError, match=r"t.log: the curve ends at step 50, but the comparison needs steps up to 100"):
        compare_losses(reference, candidate, steps=100)
