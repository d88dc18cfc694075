"""The fault campaign: tries to lose a run's state or hang or crash the project, and counts.

Families of cases (each case is tried, then judged survived or lost):

- kill:   a tiny single-device training run (checkpoint every step) is SIGKILLed at a random moment,
          including during checkpoint writes and during a resume's start-up, then resumed; lost when
          the loss history is shorter than the newest checkpoint, the newest complete checkpoint
          cannot be loaded, a start leaves a temporary (`*.tmp.<pid>`) behind, or the final run does
          not end with every step logged once.
- torn:   the newest checkpoint's shard or manifest, the `latest` pointer or the metrics log is cut
          short, zeroed to its end or overwritten inside, then the run resumes; lost on anything but
          a resume from an intact checkpoint or a one-line UserError (and, for a metrics log that was
          only cut short or zeroed to its end, anything but a resume).
- cli:    a table of bad flags and files for `h2 train`, `h2 model-info` and `heteroauto`; lost on
          anything but exit status 2 with one line on stderr.
- frame:  random and mutated DiComm frame headers through the frame decoder; lost on anything but
          a decoded header or a FrameError.

`--mode quick` (CI, through tests/test_fault_campaign.py) tries a few cases of each family; `--mode
full` tries at least 500. Prints one line per family and the totals: tried, survived, lost; exit
status 1 when any case was lost.

Run: python benchmarks/faults/campaign.py --mode full --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the thread setting)

from h2.core.errors import UserError  # noqa: E402
from h2.data import load_stdlib_corpus  # noqa: E402
from h2.model import preset  # noqa: E402
from h2.train import TrainConfig, Trainer  # noqa: E402
from h2.train.checkpoint import CheckpointDir  # noqa: E402
from h2.train.metrics import read_metrics  # noqa: E402

STEPS = 4
CASES = {"quick": {"kill": 4, "torn": 4, "cli": 12, "frame": 40},
         "full": {"kill": 60, "torn": 60, "cli": 40, "frame": 360}}


class Lost(Exception):
    """A case whose outcome the campaign counts as lost (state lost, hang, traceback, leak)."""


# ---- kill: SIGKILL a training run at a random moment, then resume -------------------------------
_CORPUS = None


def _corpus():
    global _CORPUS
    if _CORPUS is None:
        _CORPUS = load_stdlib_corpus(max_bytes=1 << 18)
    return _CORPUS


def _train(out: str, resume: bool) -> None:
    torch.set_num_threads(1)
    config = TrainConfig(steps=STEPS, micro_batch_size=2, seq_len=32, warmup_steps=1, checkpoint_every=1,
                         keep_checkpoints=2)
    with contextlib.redirect_stderr(io.StringIO()):
        # without an intact checkpoint a user starts over (the folder may hold a torn one: refused otherwise)
        Trainer(preset("tiny"), config, out, resume=resume, overwrite=not resume, corpus=_corpus(),
                show_progress=False).run()


def _child(out: str, resume: bool) -> None:
    try:
        _train(out, resume)
    except BaseException as error:  # noqa: BLE001 - a child reports what ended it through its status
        print(f"child failed: {type(error).__name__}: {error}", file=sys.stderr)
        os._exit(3)
    os._exit(0)


def _temporaries(out: str) -> list[str]:
    return [os.path.join(folder, name) for folder, _, names in os.walk(out) for name in names if ".tmp." in name]


def _check_state(out: str) -> int:
    """The run's state after a kill: returns the newest complete checkpoint's step (0: none)."""
    checkpoints = CheckpointDir(out)
    complete = checkpoints.complete_steps()
    newest = 0
    if complete:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                newest = checkpoints.load_latest(say=lambda line: None).step
        except UserError as error:
            raise Lost(f"no loadable checkpoint although {complete} are complete: {error}") from None
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics):
        with contextlib.redirect_stderr(io.StringIO()):
            steps = [record["step"] for record in read_metrics(metrics)]
        if steps != list(range(1, len(steps) + 1)):
            raise Lost(f"metrics steps are not 1..n: {steps}")
        if len(steps) < newest:
            raise Lost(f"loss history has {len(steps)} steps, the newest checkpoint is step {newest}")
    elif newest:
        raise Lost(f"metrics.jsonl missing beside checkpoint step {newest}")
    return newest


def kill_case(rng: random.Random, workdir: str, timeout_s: float) -> None:
    out = os.path.join(workdir, "run")
    context = multiprocessing.get_context("fork")
    for _kill in range(rng.randint(1, 3)):
        resume = bool(CheckpointDir(out).complete_steps())
        child = context.Process(target=_child, args=(out, resume))
        child.start()
        child.join(rng.uniform(0.0, 1.5))
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join(timeout_s)
        _check_state(out)
    resume = bool(CheckpointDir(out).complete_steps())
    child = context.Process(target=_child, args=(out, resume))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)
        raise Lost(f"the final run did not finish within {timeout_s} s")
    if child.exitcode != 0:
        raise Lost(f"the final run failed (exit status {child.exitcode})")
    if _check_state(out) != STEPS:
        raise Lost("the final run did not end with a checkpoint of the last step")
    with contextlib.redirect_stderr(io.StringIO()):
        logged = [record["step"] for record in read_metrics(os.path.join(out, "metrics.jsonl"))]
    if logged != list(range(1, STEPS + 1)):
        raise Lost(f"final loss history {logged}")
    if _temporaries(out):
        raise Lost(f"temporaries left: {_temporaries(out)}")


# ---- torn: damage the newest state, then resume ----------------------------------------------------
_PRISTINE: dict[str, str] = {}


def _pristine_run(workdir: str) -> str:
    if "run" not in _PRISTINE:
        out = os.path.join(tempfile.mkdtemp(prefix="faults-pristine-"), "run")
        _train(out, resume=False)
        _PRISTINE["run"] = out
    copy = os.path.join(workdir, "run")
    shutil.copytree(_PRISTINE["run"], copy)
    return copy


def _damage(path: str, rng: random.Random) -> str:
    """Cut `path` short, zero it from a random offset to its end (what a crash or a power loss can
    leave) or overwrite 64 bytes inside it with garbage (corruption); returns which."""
    data = open(path, "rb").read()
    how = rng.choice(["truncate", "zero", "garbage"])
    if how == "truncate":
        data = data[:rng.randint(0, max(0, len(data) - 1))]
    elif how == "zero":
        start = rng.randint(0, max(0, len(data) - 1))
        data = data[:start] + b"\0" * (len(data) - start)
    else:
        start = rng.randint(0, max(0, len(data) - 1))
        data = data[:start] + bytes(rng.randrange(256) for _ in range(64)) + data[start + 64:]
    with open(path, "wb") as handle:
        handle.write(data)
    return how


def torn_case(rng: random.Random, workdir: str, timeout_s: float) -> None:
    out = _pristine_run(workdir)
    newest = os.path.join(out, "checkpoints", f"step_{STEPS:08d}")
    target = rng.choice([os.path.join(newest, "rank_00000.pt"), os.path.join(newest, "manifest.json"),
                         os.path.join(out, "checkpoints", "latest"), os.path.join(out, "metrics.jsonl")])
    how = _damage(target, rng)
    try:
        config = TrainConfig(steps=STEPS, micro_batch_size=2, seq_len=32, warmup_steps=1, checkpoint_every=1,
                             keep_checkpoints=2)
        with contextlib.redirect_stderr(io.StringIO()):
            trainer = Trainer(preset("tiny"), config, out, resume=True, corpus=_corpus(), show_progress=False)
    except UserError as error:
        if "\n" in str(error):
            raise Lost(f"a multi-line error for damaged {os.path.basename(target)}") from None
        if not target.endswith("metrics.jsonl") or how == "garbage":
            return  # refused in one line naming the file (and the line of a log corrupted before its end)
        raise Lost(f"metrics.jsonl cut short ({how}) refused the resume: {error}") from None
    except Exception as error:  # noqa: BLE001 - anything else is a traceback for the user
        raise Lost(f"damaged {os.path.basename(target)}: {type(error).__name__}: {error}") from None
    if trainer.step not in (STEPS, STEPS - 1):
        raise Lost(f"resumed from step {trainer.step}, not from an intact newest checkpoint")


# ---- cli: bad flags and files ------------------------------------------------------------------------
BAD_CLI = [
    ["h2", "train", "--steps", "0"], ["h2", "train", "--steps", "-3"], ["h2", "train", "--steps", "x"],
    ["h2", "train", "--seed", "-1"], ["h2", "train", "--seed", str(2 ** 70)], ["h2", "train", "--lr", "-1"],
    ["h2", "train", "--lr", "nan"], ["h2", "train", "--micro-batch-size", "0"],
    ["h2", "train", "--micro-batch-size", "1000000000"], ["h2", "train", "--micro-batches", "0"],
    ["h2", "train", "--seq-len", "100000"], ["h2", "train", "--seq-len", "0"], ["h2", "train", "--beta1", "1"],
    ["h2", "train", "--beta2", "-0.1"], ["h2", "train", "--grad-clip", "-1"], ["h2", "train", "--dtype", "fp8"],
    ["h2", "train", "--device", "quantum"], ["h2", "train", "--checkpoint-every", "-1"],
    ["h2", "train", "--keep-checkpoints", "0"], ["h2", "train", "--warmup-steps", "-1"],
    ["h2", "train", "--preset", "huge"], ["h2", "train", "--model-config", "/no/such.yaml"],
    ["h2", "train", "--config", "/no/such.yaml"], ["h2", "train", "--resume"],
    ["h2", "train", "--resume", "--overwrite"], ["h2", "train", "--out", "/proc/no/such/dir"],
    ["h2", "train", "--strategy", "/no/such.yaml"], ["h2", "train", "--nproc", "0"],
    ["h2", "train", "--threads", "2"], ["h2", "train", "--min-lr", "1"], ["h2", "train", "--weight-decay", "-1"],
    ["h2", "model-info", "--tp", "0"], ["h2", "model-info", "--tp", "3"], ["h2", "model-info", "--seq-len", "0"],
    ["h2", "model-info", "--preset", "nope"], ["h2", "model-info", "--micro-batch-size", "-1"],
    ["heteroauto", "search", "--cluster", "/no/such.yaml"], ["heteroauto", "profile", "--cluster", "/no/such.yaml"],
    ["heteroauto", "bogus"], ["h2", "bogus"],
]


def _main_of(program: str):
    if program == "h2":
        from h2.cli.main import main
    else:
        from h2.cli.heteroauto import main
    return main


def cli_case(argv: list[str], workdir: str) -> None:
    argv = list(argv)
    if argv[:2] == ["h2", "train"] and "--out" not in argv:
        argv += ["--out", os.path.join(workdir, "run"), "--quiet"] + (["--steps", "1"] if "--steps" not in argv else [])
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            status = _main_of(argv[0])(argv[1:])
    except SystemExit as exit_:  # argparse's --help and friends
        status = exit_.code
    except Exception as error:  # noqa: BLE001 - a traceback for the user
        raise Lost(f"{' '.join(argv)}: traceback ({type(error).__name__}: {error})") from None
    lines = stderr.getvalue().strip().splitlines()
    if status != 2 or len(lines) != 1:
        raise Lost(f"{' '.join(argv)}: exit status {status}, stderr {lines[-3:]}")


# ---- frame: the frame decoder against random and mutated headers -----------------------------------
def frame_case(rng: random.Random) -> None:
    from dicomm import _dicomm_core as core

    if rng.random() < 0.5:
        header = bytes(rng.randrange(256) for _ in range(core.FRAME_HEADER_BYTES))
    else:
        header = bytearray(core.encode_frame_header(
            rng.choice(["Data", "Hello", "HelloReply", "ReadyToSend"]), tag=rng.randrange(1 << 32),
            seq=rng.randrange(1 << 16), total_bytes=rng.randrange(1 << 40), payload_bytes=rng.randrange(1 << 28)))
        for _ in range(rng.randint(1, 4)):
            header[rng.randrange(len(header))] = rng.randrange(256)
        header = bytes(header)
    try:
        core.decode_frame_header(header, 1 << 30)
    except core.FrameError as error:
        if "\n" in str(error):
            raise Lost(f"multi-line FrameError: {error!r}") from None
    except Exception as error:  # noqa: BLE001
        raise Lost(f"frame decoder raised {type(error).__name__}: {error}") from None


# ---- the campaign --------------------------------------------------------------------------------
def run(mode: str, seed: int, timeout_s: float, show=print) -> dict[str, dict[str, int]]:
    rng = random.Random(seed)
    counts: dict[str, dict[str, int]] = {}
    for family, cases in CASES[mode].items():
        tally = counts.setdefault(family, {"tried": 0, "survived": 0, "lost": 0})
        started = time.perf_counter()
        for index in range(cases):
            workdir = tempfile.mkdtemp(prefix=f"faults-{family}-")
            try:
                if family == "kill":
                    kill_case(rng, workdir, timeout_s)
                elif family == "torn":
                    torn_case(rng, workdir, timeout_s)
                elif family == "cli":
                    cli_case(BAD_CLI[index % len(BAD_CLI)] if mode == "full" else rng.choice(BAD_CLI), workdir)
                else:
                    frame_case(rng)
                tally["survived"] += 1
            except Lost as lost:
                tally["lost"] += 1
                show(f"  lost: {family} case {index}: {lost}")
            finally:
                tally["tried"] += 1
                shutil.rmtree(workdir, ignore_errors=True)
        show(f"{family:6s} tried {tally['tried']:4d}  survived {tally['survived']:4d}  lost {tally['lost']:4d}  "
             f"({time.perf_counter() - started:.1f} s)")
    total = {key: sum(tally[key] for tally in counts.values()) for key in ("tried", "survived", "lost")}
    show(f"total  tried {total['tried']:4d}  survived {total['survived']:4d}  lost {total['lost']:4d}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(CASES), default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take before it counts as hung")
    parser.add_argument("--json", metavar="FILE", help="also write the counts as JSON")
    args = parser.parse_args(argv)
    print(f"fault campaign, {args.mode} mode, seed {args.seed}, load {os.getloadavg()[0]:.1f}")
    counts = run(args.mode, args.seed, args.timeout)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(counts, handle, indent=1)
    return 1 if any(tally["lost"] for tally in counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
