"""The loss-log formats `ditorch precision-diff` reads, and how each is recognised.

Each reader turns a file into `Records`: (position, step, loss, consumed tokens or None) in file
order, plus the tokens per step where the log states them. Positions are line numbers (text) or
event numbers (TensorBoard), for messages.

=========== ============================================================ ===========================================
format      what it reads                                                tokens
=========== ============================================================ ===========================================
h2          the h2 trainer's metrics.jsonl                               `tokens` per step
jsonl       JSON objects per line: a step field (step, _step, iteration, a cumulative field (consumed_tokens, ...)
            ...) and a loss field
csv         a header naming step and loss columns (W&B exports:          a cumulative column
            `run - train/loss`), or bare `step,loss` rows
megatron    Megatron-LM's `iteration N/ M | ... | lm loss: X |` lines    consumed samples x seq_length (from the
                                                                         arguments block)
torchtitan  torchtitan's `step: N  loss: X ...` lines                    global batch size x sequence length (from
                                                                         "Training starts" line)
nanogpt     nanoGPT's `iter N: loss X, time ...` lines                   "tokens per iteration will be: N"
tensorboard scalars of event files (a file, or a folder holding one      the `ntokens_seen` tag
            run's files)
=========== ============================================================ ===========================================
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re

from ditorch.precision import tfevents
from h2.core.errors import UserError

FORMATS = ("h2", "jsonl", "csv", "megatron", "torchtitan", "nanogpt", "tensorboard")

# Names a step, a loss or a cumulative token count goes by, in order of preference (case-insensitive).
STEP_NAMES = ("step", "_step", "iteration", "iter", "global_step", "trainer/global_step")
LOSS_NAMES = ("loss", "lm loss", "lm_loss", "train/loss", "train_loss", "train/lm_loss", "training/loss",
              "train/lm loss", "loss/train", "loss_metrics/global_avg_loss", "global_avg_loss", "train/loss_step")
TOKEN_NAMES = ("consumed_tokens", "consumed tokens", "tokens_seen", "ntokens_seen", "num_tokens_seen",
               "train/tokens_seen", "tokens_consumed", "consumed_train_tokens")


@dataclasses.dataclass
class Records:
    format: str
    rows: list  # (position, step, loss, tokens or None)
    tokens_per_step: int | None = None
    unit: str = "line"  # what a position counts: "line" or "event"


# ---- values ---------------------------------------------------------------------------------------
def parse_step(value, where: str) -> int:
    if isinstance(value, bool):
        raise UserError(f"{where}: step {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return parse_step(float(value) if "." in value or "e" in value.lower() else int(value), where)
        except ValueError:
            pass
    raise UserError(f"{where}: step {value!r} is not an integer")


def parse_loss(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"{where}: loss {value!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{where}: loss {value!r} is not a number") from None


def parse_count(text: str, what: str, where: str) -> int:
    try:
        return int(float(str(text).replace(",", "")))
    except ValueError:
        raise UserError(f"{where}: {what} {text!r} is not a number") from None


def pick(names: list[str], wanted: tuple[str, ...], key: str | None, what: str, where: str,
         required: bool = True) -> str | None:
    """The first of `names` that is `key` (when given) or one of `wanted` (in their order)."""
    lowered = {name.strip().lower(): name for name in names}
    if key is not None:
        if key.strip().lower() in lowered:
            return lowered[key.strip().lower()]
        raise UserError(f"{where}: no {what} named '{key}' (has: {', '.join(names)})")
    for name in wanted:
        if name in lowered:
            return lowered[name]
    if required:
        raise UserError(f"{where}: no {what} column among {', '.join(names)} "
                        f"(looked for {', '.join(wanted[:6])}, ...; name it with --reference-key/--candidate-key)")
    return None


# ---- JSON lines -----------------------------------------------------------------------------------
H2_FIELDS = {"step", "loss", "tokens", "tokens_per_s", "step_time_s"}


def _json_objects(path: str, lines: list[str]):
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object with a step and a loss")
        yield number, where, record


def read_jsonl(path: str, lines: list[str], key: str | None = None) -> Records:
    """Every object names its step and loss; W&B history rows (with `_step`) hold only what one
    log call recorded, so rows without the loss are skipped there."""
    objects = list(_json_objects(path, lines))
    if not objects:
        return Records("jsonl", [])
    first_keys = list(objects[0][2])
    is_h2 = H2_FIELDS <= set(first_keys) and key is None
    step_name = pick(first_keys, STEP_NAMES, None, "step field", f"{path}:{objects[0][0]}", required=False) or "step"
    keys_seen = list(dict.fromkeys(k for _, _, record in objects for k in record))
    loss_name = pick(keys_seen, LOSS_NAMES, key, "loss field", path, required=False) or "loss"
    token_name = None if is_h2 else pick(keys_seen, TOKEN_NAMES, None, "", path, required=False)
    sparse_rows = step_name == "_step"
    rows, consumed = [], 0
    for number, where, record in objects:
        if sparse_rows and loss_name not in record:
            continue
        for name, label in ((step_name, "step"), (loss_name, "loss")):
            if name not in record:
                raise UserError(f"{where}: field '{name}' missing" if name ==
                                label else f"{where}: field '{name}' ({label}) missing")
        step, loss = parse_step(record[step_name], where), parse_loss(record[loss_name], where)
        tokens = None
        if is_h2 and "tokens" in record:
            consumed += parse_count(record["tokens"], "tokens", where)
            tokens = consumed
        elif token_name and record.get(token_name) is not None:
            tokens = parse_count(record[token_name], token_name, where)
        rows.append((number, step, loss, tokens))
    return Records("h2" if is_h2 else "jsonl", rows)


# ---- CSV ------------------------------------------------------------------------------------------
def _is_header(row: list[str]) -> bool:
    try:
        [float(cell) for cell in row]
        return False
    except ValueError:
        return True


def _wandb_metric(column: str) -> str:
    """A W&B panel export names columns `<run name> - <metric>` (and `...__MIN`/`__MAX` bands)."""
    return column.rsplit(" - ", 1)[-1].strip()


def read_csv(path: str, lines: list[str], key: str | None = None) -> Records:
    rows = [(number, row) for number, row in enumerate(csv.reader(lines), start=1)
            if row and any(cell.strip() for cell in row)]
    step_column, loss_column, token_column = 0, 1, None
    if rows and _is_header(rows[0][1]):
        number, header = rows[0]
        where = f"{path}:{number}"
        columns = [cell.strip() for cell in header]
        candidates = [c for c in columns if not c.endswith(("__MIN", "__MAX"))]
        step_name = pick(candidates, STEP_NAMES, None, "step", where, required=False)
        if step_name is None:
            raise UserError(f"{where}: CSV header has no 'step' column (columns: {', '.join(columns)})")
        if key is not None:
            loss_name = pick(candidates, (), key, "loss column", where)
        else:
            by_metric = {}
            for column in candidates:
                by_metric.setdefault(_wandb_metric(column).lower(), []).append(column)
            loss_name = next((by_metric[name] for name in LOSS_NAMES if name in by_metric), None)
            if loss_name is None:
                raise UserError(f"{where}: CSV header has no 'loss' column (columns: {', '.join(columns)})")
            if len(loss_name) > 1:
                raise UserError(f"{where}: several loss columns ({', '.join(loss_name)}); "
                                f"pick one with --reference-key/--candidate-key")
            loss_name = loss_name[0]
        token_name = pick(candidates, TOKEN_NAMES, None, "", where, required=False)
        step_column, loss_column = columns.index(step_name), columns.index(loss_name)
        token_column = columns.index(token_name) if token_name else None
        rows = rows[1:]
        header_given = True
    else:
        header_given = False
    records = []
    for number, row in rows:
        where = f"{path}:{number}"
        if len(row) <= max(step_column, loss_column):
            raise UserError(f"{where}: expected step,loss, got {','.join(row)!r}")
        if header_given and not row[loss_column].strip():
            continue  # W&B exports leave a metric's cell empty at steps where it was not logged
        tokens = None
        if token_column is not None and len(row) > token_column and row[token_column].strip():
            tokens = parse_count(row[token_column], "tokens", where)
        records.append((number, parse_step(row[step_column].strip(), where), parse_loss(
            row[loss_column].strip(), where), tokens))
    return Records("csv", records)


# ---- training logs on stdout ----------------------------------------------------------------------
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
NUMBER = r"[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf)"

MEGATRON_LINE = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|(.*)$")
MEGATRON_SEQ_LENGTH = re.compile(r"^\s*seq_length\s*\.{2,}\s*(\d+)\s*$")
TORCHTITAN_LINE = re.compile(r"(?<![\w ])\s*step:\s*(\d+)\s+loss:\s*(" + NUMBER + r")")
TORCHTITAN_BATCH = re.compile(r"global batch size (\d+), sequence length (\d+)")
NANOGPT_LINE = re.compile(r"\biter (\d+): loss (" + NUMBER + r")")
NANOGPT_TOKENS = re.compile(r"tokens per iteration will be: ([\d,]+)")


def read_megatron(path: str, lines: list[str], key: str | None = None) -> Records:
    """`lm loss` (or `key`) of each `iteration N/ M |` line; tokens from `consumed samples` times the
    `seq_length` of the arguments block Megatron prints first."""
    seq_length, rows, batch = None, [], None
    for number, line in enumerate(lines, start=1):
        if seq_length is None and (found := MEGATRON_SEQ_LENGTH.match(line)):
            seq_length = int(found.group(1))
            continue
        found = MEGATRON_LINE.search(line)
        if not found:
            continue
        where = f"{path}:{number}"
        fields = {}
        for part in found.group(2).split("|"):
            name, colon, value = part.partition(":")
            if colon:
                fields[name.strip().lower()] = value.strip()
        loss_name = pick(list(fields), ("lm loss", "loss"), key, "loss field", where, required=False)
        if loss_name is None:
            continue  # an interval whose iterations were all skipped logs no loss
        tokens = None
        if seq_length is not None and "consumed samples" in fields:
            tokens = parse_count(fields["consumed samples"], "consumed samples", where) * seq_length
        if "global batch size" in fields:
            batch = parse_count(fields["global batch size"], "global batch size", where)
        rows.append((number, parse_step(found.group(1), where), parse_loss(fields[loss_name], where), tokens))
    per_step = batch * seq_length if batch is not None and seq_length is not None else None
    return Records("megatron", rows, per_step)


def read_torchtitan(path: str, lines: list[str], key: str | None = None) -> Records:
    rows, per_step = [], None
    for number, line in enumerate(lines, start=1):
        line = ANSI_ESCAPE.sub("", line)
        if per_step is None and (found := TORCHTITAN_BATCH.search(line)):
            per_step = int(found.group(1)) * int(found.group(2))
        found = TORCHTITAN_LINE.search(line)
        if found and "validate step:" not in line:
            where = f"{path}:{number}"
            rows.append((number, parse_step(found.group(1), where), parse_loss(found.group(2), where), None))
    return Records("torchtitan", rows, per_step)


def read_nanogpt(path: str, lines: list[str], key: str | None = None) -> Records:
    rows, per_step = [], None
    for number, line in enumerate(lines, start=1):
        if per_step is None and (found := NANOGPT_TOKENS.search(line)):
            per_step = parse_count(found.group(1), "tokens per iteration", f"{path}:{number}")
        found = NANOGPT_LINE.search(line)
        if found:
            where = f"{path}:{number}"
            rows.append((number, parse_step(found.group(1), where), parse_loss(found.group(2), where), None))
    return Records("nanogpt", rows, per_step)


# ---- TensorBoard ----------------------------------------------------------------------------------
TOKEN_TAGS = ("ntokens_seen", "consumed_tokens", "tokens_seen", "train/tokens_seen")


def event_files(folder: str) -> list[str]:
    """The event files of the one run a folder holds (TensorBoard reads a folder's files in name order)."""
    found = {}
    for root, _, names in os.walk(folder):
        files = sorted(os.path.join(root, n) for n in names if "tfevents" in n)
        if files:
            found[root] = files
    if len(found) > 1:
        shown = ", ".join(os.path.relpath(root, folder) for root in sorted(found)[:4])
        raise UserError(f"{folder}: holds the event files of {len(found)} runs ({shown}); pass one run's folder")
    return next(iter(found.values()), [])


def read_tensorboard(paths: list[str], key: str | None = None) -> Records:
    """The loss tag's scalars. As TensorBoard does on a restarted run, a step at or before one
    already read discards the values read for it and the steps after it."""
    scalars = [(path, s) for path in paths for s in tfevents.read_scalars(path)]
    where = paths[0] if len(paths) == 1 else os.path.dirname(paths[0])
    tags = list(dict.fromkeys(s.tag for _, s in scalars))
    if not tags:
        raise UserError(f"{where}: no scalars in the event file(s)")
    tag = pick(tags, LOSS_NAMES, key, "scalar tag", where, required=False)
    if tag is None:
        raise UserError(f"{where}: no loss among the scalar tags ({', '.join(tags[:12])}); "
                        f"name it with --reference-key/--candidate-key")
    token_tag = pick(tags, TOKEN_TAGS, None, "", where, required=False)
    losses, tokens = {}, {}
    for _, s in scalars:
        series = losses if s.tag == tag else tokens if s.tag == token_tag else None
        if series is None:
            continue
        for stale in [step for step in series if step >= s.step]:
            del series[stale]
        series[s.step] = (s.event, s.value)
    rows = [(event, step, loss, int(tokens[step][1]) if step in tokens else None)
            for step, (event, loss) in losses.items()]
    return Records("tensorboard", rows, unit="event")


# ---- recognising a format -------------------------------------------------------------------------
TEXT_READERS = {
    "h2": read_jsonl, "jsonl": read_jsonl, "csv": read_csv, "megatron": read_megatron, "torchtitan": read_torchtitan,
    "nanogpt": read_nanogpt
}
LINE_PATTERNS = {"megatron": MEGATRON_LINE, "torchtitan": TORCHTITAN_LINE, "nanogpt": NANOGPT_LINE}


def detect_text_format(path: str, lines: list[str]) -> str:
    first = next((line.strip() for line in lines if line.strip()), "")
    if path.endswith((".jsonl", ".json")) or first.startswith("{"):
        return "jsonl"
    sample = [ANSI_ESCAPE.sub("", line) for line in lines[:20000]]
    counts = {name: sum(1 for line in sample if pattern.search(line)) for name, pattern in LINE_PATTERNS.items()}
    best = max(counts, key=counts.get)
    if counts[best]:
        return best
    if path.endswith(".csv") or "," in first or not _is_header(first.split(",")):
        return "csv"
    raise UserError(
        f"{path}: not a loss log this reads (h2 metrics.jsonl, JSONL, CSV, a Megatron-LM, "
        f"torchtitan or nanoGPT log, TensorBoard events); name the format with --reference-format/--candidate-format")
