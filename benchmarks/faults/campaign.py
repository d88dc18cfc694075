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
- ranks:  a two-rank pipeline job (`h2 train --strategy`, tiny model, DiComm between the stages,
          checkpoint every step) whose rank 0 or 1 is SIGKILLed or SIGSTOPped at a random moment of
          its steps; lost when the job does not end within --rank-timeout plus a grace period (a
          hang), its error does not name the rank, a process or a `/dev/shm` segment of the job is
          left, the loss history is shorter than the newest checkpoint, or the resumed job does not
          end with every step logged once and no temporary left.
- dicomm: DiComm ranks against a peer that dies mid-message, a peer that stops (SIGSTOP), a peer
          with another job's token, 20-60 idle, slow and garbage connections, an unposted flood, and
          a rank killed during setup; lost on a hang past the configured timeout, an error that does
          not name the peer, a setup slowed by a second or more, or a `/dev/shm` segment of a rank
          left behind.

- input-yaml: damaged spec files (deep nesting, duplicate keys, a FIFO, a folder, binary, Latin-1,
          empty, a list, 17 MiB, missing, /proc/self/mem, /dev/zero) through every loader (job file,
          cluster, Di-PS run file, model, strategy, Di-PS scenario); lost on anything but a one-line
          UserError naming the file.
- input-train, input-run, input-ps, input-heteroauto, input-ditorch, input-bench: tables of bad
          flags, files and environment variables per command (every typed flag of h2 train's config
          classes with bad values of its type; h2 run/plan/profile/check; h2 ps master, shard, launch,
          simulate and each run-file field; heteroauto search, partition, profile, simulate,
          cross-site; ditorch conformance, precision-diff, replay; the DiComm benchmark), each run as
          a user runs it; lost on anything but exit status 2 with one line on stderr and no
          traceback within 90 s, or anything left in its TMPDIR.
- signals: SIGTERM, SIGINT (to the launcher alone, or to its group), SIGHUP or SIGKILL to a
          two-rank `h2 train --strategy` during its start-up or its steps; lost on a traceback or C++
          stack trace, another exit status (143, 130, 130, 129, killed), a process of the job left
          running, or its `h2-job-*` folder left in TMPDIR (after SIGKILL: once the next launcher ran).
- security: a Di-PS job (master and two shards with the run's secrets, clusters c1 and c2 listed, c1
          joined with its credential; tests/ps/ps_harness.py), started once, attacked case by case by a
          process of its own holding no credential (benchmarks/faults/ps_attacker.py): Status, a pull
          from a shard, a forged Pulled, Join as c1/c2, Leave, a push ticket and a commit claiming 10^9
          tokens, layers pushed under c1's real ticket, a shard re-registered, a shard's
          Expect/Holds/Measure/Prepare/Commit/Forget with NaN layers, a ticket flood, c1's captured
          calls replayed or signed outside the replay window; each call without a signature, under a
          key of another run, or with made-up signature headers. Lost when the attacker got any answer,
          a shard's parameters, staging or registration, the master's version, tokens or a cluster's
          session, or the run's log changed, the attack hung, or c1 can no longer beat, read the status
          and pull the model it pulled at the start.
- checkpoint: a damaged checkpoint folder of a 6-step `h2 train` (3 checkpoints kept): 4 KiB zeroed
          inside the newest shard, the previous step's shard copied in, a bit flipped in the manifest
          (valid JSON, or not), the shard missing or cut short, the newest step folder empty, the two
          newest damaged, `latest` naming a gone step, all damaged, `checkpoints/` a file or empty;
          then `h2 train --resume`. Lost unless it resumes from the newest intact checkpoint, naming it
          in one line, with the loss log equal to the uninterrupted run's, or, with nothing intact,
          refuses in one line with exit status 2.
- concurrency: two runs started 0-1.5 s apart on one --out (two `h2 train`, two pipelines, two
          `--resume`, `h2 train` and a pipeline, `h2 run` and `h2 ps launch`); lost unless exactly one
          is refused in one line (exit 2) naming a pid of the other, the other ends 0 with steps 1..n
          logged once (`h2 run`/`h2 ps launch`: stopped with SIGTERM once the refusal came, then no
          traceback), no process is left and nothing is left in TMPDIR.
- disk-full: `h2 train` or a two-rank pipeline whose --out is a real tmpfs (1-40 MiB) mounted in a
          mount namespace of the case's own (`unshare -m`; needs root), its free space taken by a
          filler once a drawn checkpoint is complete; lost unless the run ends 0 with every step, the
          start-up check refuses it (exit 2, one line), or it ends with exit 1 and a line naming the
          file and ENOSPC (`h2 train`: that one line only), the previous checkpoint loadable and no
          temporary left; a traceback or anything left in TMPDIR is lost.

A family is one function registered with `@family(name, quick=..., full=...)`; `--families` runs a
subset, `--list` prints the cases per mode.

Every case runs its processes with TMPDIR set to a folder of its own; anything left there after the
case (a launcher's job file, torchrun's folders) counts as a leaked temporary, as does a
`*.tmp.<pid>` file left in a run folder after the run that follows a kill.

`--mode quick` (CI, through tests/test_fault_campaign.py) tries a few cases of each family; `--mode
full` tries every table entry once (1117 cases; kill and ranks, the slowest, cut to 30 and 6 so
that a full run takes about an hour on a busy 2-core host). Prints one line per family and the totals:
tried, survived, lost; exit status 1 when any case was lost.

Run: python benchmarks/faults/campaign.py --mode full --seed 0
"""

from __future__ import annotations

import argparse
import atexit
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
from dataclasses import dataclass
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import glob  # noqa: E402
import subprocess  # noqa: E402

import torch  # noqa: E402  (after the thread setting)

from h2.core.errors import UserError  # noqa: E402
from h2.data import load_stdlib_corpus  # noqa: E402
from h2.model import preset  # noqa: E402
from h2.train import TrainConfig, Trainer  # noqa: E402
from h2.train.checkpoint import CheckpointDir, shard_name  # noqa: E402
from h2.train.metrics import read_metrics  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO_ROOT, "tests", "dicomm"), os.path.join(REPO_ROOT, "tests", "heteropp")]

STEPS = 4
MODES = ("quick", "full")


class Lost(Exception):
    """A case whose outcome the campaign counts as lost (state lost, hang, traceback, leak)."""


# ---- the families: a registry (a new family is one decorated function) ---------------------------
@dataclass
class Case:
    """One case of a family: its random source, a folder of its own (removed after it), the time a run
    may take, its index in the family and the mode."""
    rng: random.Random
    workdir: str
    timeout_s: float
    index: int
    mode: str

    def pick(self, table: list):
        """Full mode walks `table` in order (every entry once); quick mode picks at random."""
        return table[self.index % len(table)] if self.mode == "full" else self.rng.choice(table)


@dataclass(frozen=True)
class Family:
    name: str
    run: Callable[[Case], None]
    cases: dict[str, int]  # mode -> cases tried


FAMILIES: dict[str, Family] = {}


def family(name: str, *, quick: int, full: int):
    """Register `function(case)` as the family `name`: it returns when the case survived and raises
    Lost otherwise. Families run in the order they are registered."""

    def register(function: Callable[[Case], None]) -> Callable[[Case], None]:
        FAMILIES[name] = Family(name, function, {"quick": quick, "full": full})
        return function

    return register


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


def _check_final_run(out: str, steps: int) -> None:
    """The run that followed the faults logged every step once and left no temporary."""
    with contextlib.redirect_stderr(io.StringIO()):
        logged = [record["step"] for record in read_metrics(os.path.join(out, "metrics.jsonl"))]
    if logged != list(range(1, steps + 1)):
        raise Lost(f"final loss history {logged}")
    if _temporaries(out):
        raise Lost(f"temporaries left: {_temporaries(out)}")


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
    _check_final_run(out, STEPS)


# ---- torn: damage the newest state, then resume ----------------------------------------------------
_PRISTINE: dict[str, str] = {}


def _pristine_run(workdir: str) -> str:
    if "run" not in _PRISTINE:
        out = os.path.join(tempfile.mkdtemp(prefix="faults-pristine-"), "run")
        atexit.register(shutil.rmtree, os.path.dirname(out), True)
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
    target = rng.choice([
        os.path.join(newest, "rank_00000.safetensors"),
        os.path.join(newest, "manifest.json"),
        os.path.join(out, "checkpoints", "latest"),
        os.path.join(out, "metrics.jsonl")
    ])
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
    ["h2", "train", "--steps", "0"],
    ["h2", "train", "--steps", "-3"],
    ["h2", "train", "--steps", "x"],
    ["h2", "train", "--seed", "-1"],
    ["h2", "train", "--seed", str(2**70)],
    ["h2", "train", "--lr", "-1"],
    ["h2", "train", "--lr", "nan"],
    ["h2", "train", "--micro-batch-size", "0"],
    ["h2", "train", "--micro-batch-size", "1000000000"],
    ["h2", "train", "--micro-batches", "0"],
    ["h2", "train", "--seq-len", "100000"],
    ["h2", "train", "--seq-len", "0"],
    ["h2", "train", "--beta1", "1"],
    ["h2", "train", "--beta2", "-0.1"],
    ["h2", "train", "--grad-clip", "-1"],
    ["h2", "train", "--dtype", "fp8"],
    ["h2", "train", "--device", "quantum"],
    ["h2", "train", "--checkpoint-every", "-1"],
    ["h2", "train", "--keep-checkpoints", "0"],
    ["h2", "train", "--warmup-steps", "-1"],
    ["h2", "train", "--preset", "huge"],
    ["h2", "train", "--model-config", "/no/such.yaml"],
    ["h2", "train", "--config", "/no/such.yaml"],
    ["h2", "train", "--resume"],
    ["h2", "train", "--resume", "--overwrite"],
    ["h2", "train", "--out", "/proc/no/such/dir"],
    ["h2", "train", "--strategy", "/no/such.yaml"],
    ["h2", "train", "--nproc", "0"],
    ["h2", "train", "--threads", "2"],
    ["h2", "train", "--min-lr", "1"],
    ["h2", "train", "--weight-decay", "-1"],
    ["h2", "model-info", "--tp", "0"],
    ["h2", "model-info", "--tp", "3"],
    ["h2", "model-info", "--seq-len", "0"],
    ["h2", "model-info", "--preset", "nope"],
    ["h2", "model-info", "--micro-batch-size", "-1"],
    ["heteroauto", "search", "--cluster", "/no/such.yaml"],
    ["heteroauto", "profile", "--cluster", "/no/such.yaml"],
    ["heteroauto", "bogus"],
    ["h2", "bogus"],
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
        header = bytearray(
            core.encode_frame_header(rng.choice(["Data", "Hello", "HelloReply", "ReadyToSend"
                                                 ]), tag=rng.randrange(1 << 32), seq=rng.randrange(1 << 16),
                                     total_bytes=rng.randrange(1 << 40), payload_bytes=rng.randrange(1 << 28)))
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


# ---- leaks: what a case's processes left behind ---------------------------------------------------
def _segments_of(pids) -> list[str]:
    """The DiComm shared-memory segments (/dev/shm/dicomm-<pid>-...) of `pids`."""
    return sorted(path for pid in pids for path in glob.glob(f"/dev/shm/dicomm-{pid}-*"))


def _case_tmpdir(workdir: str) -> str:
    """The TMPDIR a case's processes run with: whatever they leave there is the case's own."""
    folder = os.path.join(workdir, "tmp")
    os.makedirs(folder, exist_ok=True)
    return folder


def _check_no_leaks(pids, tmpdir: str) -> None:
    segments = _segments_of(pids)
    if segments:
        raise Lost(f"/dev/shm segments left: {segments}")
    left = [name for name in os.listdir(tmpdir) if not name.startswith("torchinductor_")]  # torch's compile cache
    if left:
        raise Lost(f"temporaries left in TMPDIR: {left}")


# ---- ranks: kill or stop a rank of a two-rank pipeline job, then resume ------------------------------
PP2 = os.path.join(REPO_ROOT, "configs", "strategies", "local-tiny-pp2.yaml")
RANK_STEPS = 6
RANK_TIMEOUT_S = 5.0
# After a rank is lost the other must end within --rank-timeout; torchrun then stops the job's
# processes (SIGTERM, SIGKILL after its own grace period), which on a busy 2-core host takes a while.
END_GRACE_S = 60.0


def _pipeline_job(out: str, tmpdir: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([
        sys.executable, "-m", "h2", "train", "--strategy", PP2, "--steps",
        str(RANK_STEPS), "--checkpoint-every", "1", "--keep-checkpoints", "2", "--p2p-backend", "dicomm",
        "--rank-timeout",
        str(RANK_TIMEOUT_S), "--out", out, *extra
    ], cwd=REPO_ROOT, env={**os.environ, "TMPDIR": tmpdir}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _end(job: subprocess.Popen, within_s: float, what: str) -> str:
    """The job's stderr once it ended within `within_s`; a hang is killed and counted lost. Its ranks
    run in sessions of their own (torchrun's), so they are killed one by one with the job's group:
    a rank left alive would hold the job's pipes open and keep the campaign waiting."""
    from test_heteropp_rank_loss import descendants

    try:
        return job.communicate(timeout=within_s)[1]
    except subprocess.TimeoutExpired:
        every = descendants(job.pid)
        os.killpg(job.pid, signal.SIGKILL)
        for pid in every:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            job.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        raise Lost(f"{what} did not end within {within_s:.0f} s (a hang)") from None


def _logged_steps(out: str) -> int:
    try:
        with open(os.path.join(out, "metrics.jsonl"), "rb") as handle:
            return handle.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait_for_ranks(job: subprocess.Popen, out: str, step: int, timeout_s: float) -> dict[int, int]:
    """RANK -> pid once `step` steps are logged."""
    from test_heteropp_rank_loss import rank_pids

    deadline = time.monotonic() + timeout_s
    while _logged_steps(out) < step or len(ranks := rank_pids(job.pid)) < 2:
        if job.poll() is not None:
            raise Lost(f"the job ended (status {job.returncode}) before step {step}: {job.communicate()[1][-300:]}")
        if time.monotonic() > deadline:
            raise Lost(f"the job did not log step {step} within {timeout_s:.0f} s")
        time.sleep(0.02)
    return ranks


def _killed_leftovers(pids: list[int]) -> list[int]:
    """The processes of `pids` still alive END_GRACE_S after their job ended, SIGKILLed (a leak to report)."""
    from test_heteropp_rank_loss import alive

    end = time.monotonic() + END_GRACE_S
    while [pid for pid in pids if alive(pid)] and time.monotonic() < end:
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def ranks_case(rng: random.Random, workdir: str, timeout_s: float, index: int) -> None:
    from test_heteropp_rank_loss import alive, descendants

    out, tmpdir = os.path.join(workdir, "run"), _case_tmpdir(workdir)
    how = ("SIGKILL", "SIGSTOP")[index % 2]
    victim = rng.randrange(2)
    job = _pipeline_job(out, tmpdir)
    try:
        ranks = _wait_for_ranks(job, out, rng.randint(1, RANK_STEPS - 2), timeout_s)
        time.sleep(rng.uniform(0.0, 0.3))  # inside a step or a checkpoint write
        pids = [job.pid, *descendants(job.pid)]
        try:
            os.kill(ranks[victim], getattr(signal, how))
        except ProcessLookupError:
            pass  # the victim had finished and exited already: the job must end 0 with every step logged
        stderr = _end(job, RANK_TIMEOUT_S + END_GRACE_S, f"the job after a {how} of rank {victim}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    if job.returncode == 0:  # the victim had finished its last step already
        if _logged_steps(out) != RANK_STEPS:
            raise Lost(f"the job exited 0 after a {how} of rank {victim} without logging every step")
    else:
        why = "died" if how == "SIGKILL" else "stopped responding"
        if f"rank {victim} (stage {victim}, chip" not in stderr or why not in stderr:
            raise Lost(f"a {how} of rank {victim} was not reported naming it ({why}): {stderr.strip()[-300:]}")
    deadline = time.monotonic() + 10
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    if [pid for pid in pids if alive(pid)]:
        raise Lost(f"processes of the job left running: {[pid for pid in pids if alive(pid)]}")
    _check_no_leaks(pids, tmpdir)
    _check_state(out)
    resume = bool(CheckpointDir(out).complete_steps())
    again = _pipeline_job(out, tmpdir, "--resume" if resume else "--overwrite")
    stderr = _end(again, timeout_s, "the resumed job")
    if again.returncode != 0:
        raise Lost(f"the resumed job failed (status {again.returncode}): {stderr.strip()[-300:]}")
    _check_final_run(out, RANK_STEPS)
    _check_no_leaks(pids, tmpdir)


# ---- dicomm: dead, stopped, foreign and hostile peers -------------------------------------------------
DICOMM_CASES = ("peer_killed", "silent_peer", "wrong_token", "strangers", "flood", "setup_killed")


def _dicomm_peer_killed(rng, store_dir, pids):
    from scenarios import start

    with start("peer_killed", transport=rng.choice(["tcp", "shm"]), store_dir=store_dir) as job:
        pids += [job.pid(0), job.pid(1)]
        (survivor, ) = job.results(ranks=[1], timeout=60)
    # The message may have arrived whole before its sender died (shm writes into the receiver's
    # memory); otherwise the receive must fail naming the dead peer, within seconds.
    if (survivor["error"] and "rank 0" not in survivor["error"]) or survivor["seconds"] >= 5:
        raise Lost(f"a peer killed mid-message: {survivor}")


def _dicomm_silent_peer(rng, store_dir, pids):
    from scenarios import start

    with start("silent_peer", transport=rng.choice(["tcp", "shm"]), store_dir=store_dir,
               request_timeout=1.0) as job:  # the end of the block kills the stopped rank 0
        pids += [job.pid(0), job.pid(1)]
        (outcome, ) = job.results(ranks=[1], timeout=60)
    if "timed out" not in outcome["recv"] or "timed out" not in outcome["large_send"] or outcome["seconds"] >= 4:
        raise Lost(f"a stopped peer (1 s request timeout): {outcome}")


def _dicomm_wrong_token(rng, store_dir, pids):
    from scenarios import start

    with start("token", transport="tcp", store_dir=store_dir, tokens=["job-a", "job-b"], connect_timeout=60) as job:
        pids += [job.pid(0), job.pid(1)]
        ours, foreign = job.results(timeout=60)
    if not ours["error"].startswith("rank 1 gave up connecting to rank 0: ") or ours["seconds"] >= 5:
        raise Lost(f"the listener of a peer with another job's token (60 s connect timeout): {ours}")
    if "job token mismatch" not in foreign["error"]:
        raise Lost(f"the peer with another job's token: {foreign}")


def _dicomm_strangers(rng, store_dir, pids):
    from scenarios import start
    from test_faults import read_descriptor
    from test_listener import strangers

    with start("echo", ranks=[0], store_dir=store_dir, token="t") as listener:
        pids.append(listener.pid(0))
        opened = strangers(*read_descriptor(store_dir, 0), rng.randint(0, 30), rng.randint(0, 20), rng.randint(0, 10))
        try:
            with start("echo", ranks=[1], store_dir=store_dir, token="t") as talker:
                pids.append(talker.pid(1))
                (talked, ) = talker.results(timeout=60)
                (listened, ) = listener.results(timeout=60)
        finally:
            for connection in opened:
                connection.close()
    if listened["data"] != "hello" or talked["setup_s"] >= 1.0:
        raise Lost(f"{len(opened)} strangers: setup took {talked['setup_s']:.2f} s, received {listened}")


def _dicomm_flood(rng, store_dir, pids):
    from dicomm import _dicomm_core as core
    from scenarios import start
    from test_faults import impersonate_rank_1

    budget, piece = 1 << 20, 256 << 10
    tag = rng.randrange(1 << 20)
    with start("echo", ranks=[0], store_dir=store_dir, token="t", request_timeout=30,
               env={"DICOMM_UNEXPECTED_BYTES": str(budget)}) as victim:
        pids.append(victim.pid(0))
        connection = impersonate_rank_1(store_dir, "t")
        try:
            for seq in range(4 * budget // piece):
                frame = core.encode_frame_header("Data", tag=tag, seq=seq, total_bytes=piece, payload_bytes=piece)
                connection.sendall(frame + b"z" * piece)
        except OSError:
            pass  # the victim closed the connection at its budget
        (result, ) = victim.results(timeout=60)
        connection.close()
    if "rank 1" not in result["error"] or f"tag {tag}" not in result["error"] or "budget" not in result["error"]:
        raise Lost(f"an unposted flood of 4x the budget: {result}")


def _dicomm_setup_killed(rng, store_dir, pids):
    from scenarios import start

    connect_timeout = 5.0
    with start("token", ranks=[0], transport="shm", store_dir=store_dir, tokens=["t", "t"],
               connect_timeout=connect_timeout) as waiting:
        pids.append(waiting.pid(0))
        with start("token", ranks=[1], transport="shm", store_dir=store_dir, tokens=["t", "t"],
                   connect_timeout=connect_timeout) as killed:
            pids.append(killed.pid(1))
            time.sleep(rng.uniform(0.0, 1.5))  # start-up, setup or the barrier after it
            killed.kill(1)
            killed.wait(1, timeout=30)
        try:
            waiting.wait(0, timeout=connect_timeout + 30)
        except Exception as error:  # noqa: BLE001 - RankFailure: rank 0 did not end
            raise Lost(f"rank 0 after its peer was killed during setup: {error}") from None


def dicomm_case(rng: random.Random, workdir: str, timeout_s: float, index: int) -> None:
    kind = DICOMM_CASES[index % len(DICOMM_CASES)]
    store_dir, pids = os.path.join(workdir, "store"), []
    os.makedirs(store_dir)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = tmpdir = _case_tmpdir(workdir)  # the ranks' environment
    try:
        globals()[f"_dicomm_{kind}"](rng, store_dir, pids)
    except Lost as lost:
        raise Lost(f"{kind}: {lost}") from None
    except Exception as error:  # noqa: BLE001 - a rank failed in a way the case did not expect
        raise Lost(f"{kind}: {type(error).__name__}: {str(error)[-400:]}") from None
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous
    try:
        _check_no_leaks(pids, tmpdir)
    except Lost as lost:
        raise Lost(f"{kind}: {lost}") from None


# ---- bad input: damaged spec files, and a table of bad flags per command -------------------------------
def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as handle:
        handle.write(data)
    return path


# Damaged spec files, each made on demand in a case's folder: `{name}` in a table's argv names one.
DAMAGED = {
    "deep": lambda folder: _write(os.path.join(folder, "deep.yaml"), b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n"),
    "deep-map": lambda folder: _write(
        os.path.join(folder, "deep-map.yaml"), "".join("  " * depth + f"k{depth}:\n"
                                                       for depth in range(3000)).encode() + b"  " * 3000 + b"v: 1\n"),
    "duplicate": lambda folder: _write(os.path.join(folder, "duplicate.yaml"), b"name: a\nname: b\n"),
    "fifo": lambda folder: (os.mkfifo(os.path.join(folder, "fifo.yaml")), os.path.join(folder, "fifo.yaml"))[1],
    "folder": lambda folder: (os.makedirs(os.path.join(folder, "dir.yaml")), os.path.join(folder, "dir.yaml"))[1],
    "binary": lambda folder: _write(os.path.join(folder, "binary.yaml"),
                                    bytes(range(256)) * 4),
    "latin1": lambda folder: _write(os.path.join(folder, "latin1.yaml"), "name: caf\u00e9\n".encode("latin-1")),
    "empty": lambda folder: _write(os.path.join(folder, "empty.yaml"), b""),
    "list": lambda folder: _write(os.path.join(folder, "list.yaml"), b"- 1\n- 2\n"),
    "huge": lambda folder: _write(os.path.join(folder, "huge.yaml"), b"# " + b"x" * (17 << 20) + b"\n"),
    "missing": lambda folder: os.path.join(folder, "no-such.yaml"),
    "proc-mem": lambda folder: "/proc/self/mem",
    "dev-zero": lambda folder: "/dev/zero",
}


def _resolve(argv: list[str], folder: str) -> list[str]:
    """`{name}` of DAMAGED (or `{folder}`) in argv made into a path inside `folder`."""
    made: dict[str, str] = {"folder": folder}

    def path(match) -> str:
        name = match.group(1)
        if name not in made:
            made[name] = DAMAGED[name](folder)
        return made[name]

    import re

    return [re.sub(r"\{([a-z0-9-]+)\}", path, part) for part in argv]


def _loaders() -> dict:
    from h2.cli.main import JOB_CONFIGS
    from h2.core import flags
    from h2.core.cluster import load_cluster
    from h2.core.dips import load_dips_config
    from h2.core.model_config import load_model_config
    from h2.core.strategy import load_strategy
    from h2.ps.simulator import load_scenario

    return {
        "job file": lambda path: flags.job_values(path, JOB_CONFIGS), "cluster file": load_cluster,
        "Di-PS run file": load_dips_config, "model file": load_model_config, "strategy file": load_strategy,
        "Di-PS scenario": load_scenario
    }


YAML_CASES = [(loader, damage) for loader in ("job file", "cluster file", "Di-PS run file", "model file",
                                              "strategy file", "Di-PS scenario") for damage in DAMAGED]


def loader_case(loader: str, damage: str, workdir: str) -> None:
    """A damaged spec file through its loader: a one-line UserError naming the file, nothing else."""
    (path, ) = _resolve([f"{{{damage}}}"], workdir)
    try:
        _loaders()[loader](path)
    except UserError as error:
        if "\n" in str(error) or path not in str(error):
            raise Lost(f"{loader}, {damage}: the error does not name the file in one line: {error}") from None
        return
    except Exception as error:  # noqa: BLE001 - anything else is a traceback for the user
        raise Lost(f"{loader}, {damage}: {type(error).__name__}: {str(error)[:200]}") from None
    raise Lost(f"{loader}, {damage}: accepted")


PROGRAMS = {
    "h2": ["-m", "h2"], "heteroauto": ["-m", "h2.cli.heteroauto"], "ditorch": ["-m", "h2.cli.ditorch"],
    "dicomm-bench": [os.path.join(REPO_ROOT, "benchmarks", "dicomm", "bench.py")]
}
SPEC_DAMAGES = ("deep", "duplicate", "fifo", "folder", "binary", "missing", "proc-mem", "dev-zero")
INPUT_TIMEOUT_S = 90.0  # a refusal comes before any work; past this the command is counted as working on
CAMPAIGN_CLUSTER = os.path.join(REPO_ROOT, "configs", "clusters", "local-hetero.yaml")
DIPS_RUN = os.path.join(REPO_ROOT, "configs", "dips", "local-4.yaml")
SCENARIO = os.path.join(REPO_ROOT, "configs", "dips", "paper-table1.yaml")
XDC_SCENARIO = os.path.join(REPO_ROOT, "configs", "xdc", "gpt3-175b.yaml")


def _flag_values(annotation) -> list[str]:
    """Bad values of a flag of this type."""
    import typing

    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = options[0]
    if kind is float:
        return ["nan", "inf", "-inf", "1e999", "x"]
    if kind is int:
        return ["x", "1.5", str(2**63), "-1"]
    if typing.get_origin(kind) is typing.Literal:
        return ["bogus"]
    return []


def _short_train(*argv: str) -> list[str]:
    """h2 train with `argv`, one step into the case's folder unless `argv` says otherwise: a bad value
    accepted by mistake ends soon (and is counted lost)."""
    return [
        "h2", "train", *argv, *([] if "--steps" in argv else ["--steps", "1"]),
        *([] if "--out" in argv else ["--out", "{folder}/run"])
    ]


def _train_table() -> list[tuple[list[str], dict]]:
    """h2 train: every typed flag of the job's config classes with bad values (the Di-PS flags with --ps,
    the pipeline's with --strategy, so that the value is what is refused), and damaged files."""
    import dataclasses
    import typing

    from h2.core.dips import PSOptions
    from h2.core.training import PipelineOptions, RunOptions, TrainConfig

    context = {
        PSOptions: ["--ps", "127.0.0.1:1", "--cluster-id", "c0"], PipelineOptions: ["--strategy", PP2], TrainConfig: [],
        RunOptions: []
    }
    table = []
    for config, extra in context.items():
        hints = typing.get_type_hints(config)
        for field in dataclasses.fields(config):
            if "help" not in field.metadata or field.name in ("ps", ):
                continue
            flag = "--" + field.name.replace("_", "-")
            for value in _flag_values(hints[field.name]):
                table.append((_short_train(*extra, flag, value), {}))
    for flag in ("--config", "--model-config", "--strategy", "--cluster"):
        table += [(_short_train(flag, f"{{{damage}}}"), {}) for damage in SPEC_DAMAGES]
    table += [(_short_train(*argv), {})
              for argv in (["--preset", ""], ["--preset", "huge"], ["--device", "quantum"], ["--out", "{binary}/run"],
                           ["--ps", "nowhere"], ["--ps", "127.0.0.1:99999", "--cluster-id", "c0"],
                           ["--cluster-id", "c0"], ["--strategy", PP2, "--p2p-backend", "bogus"],
                           ["--strategy", PP2, "--stage-backend", "bogus"], ["--strategy", PP2, "--nproc", "0"],
                           ["--strategy", PP2, "--max-restarts", "-1"], ["--resume", "--overwrite"])]
    return table


def _run_table() -> list[tuple[list[str], dict]]:
    """h2 run, plan, profile and check: every flag checked before profiling starts."""
    bad = [["--steps", "0"], ["--steps", str(2**63)], ["--lr", "inf"], ["--lr", "nan"], ["--lr", "-1"],
           ["--min-lr", "nan"], ["--warmup-steps", str(2**63)], ["--seed", "-1"], ["--seed", str(2**40)],
           ["--keep-checkpoints", "0"], ["--checkpoint-every", "-1"], ["--beta1", "1"], ["--grad-clip", "inf"],
           ["--threshold", "0"], ["--threshold", "nan"], ["--threshold", "inf"], ["--max-restarts", "-1"],
           ["--rank-timeout", "0"], ["--rank-timeout", "nan"], ["--threads", "0"], ["--log-every", "0"],
           ["--p2p-backend", "bogus"], ["--schedule", "bogus"], ["--nnodes", "0"], ["--nnodes", "2"],
           ["--rdzv-endpoint", "nowhere"], ["--rdzv-endpoint", "host:99999"], ["--resume", "--overwrite"],
           ["--reference", "{missing}"], ["--reference", "{binary}"]]
    table = [(["h2", "run", "--cluster", CAMPAIGN_CLUSTER, "--out", "{folder}/out", *flags], {}) for flags in bad]
    table += [(["h2", "run", "--cluster", CAMPAIGN_CLUSTER, "--out", "{binary}/out"], {})]
    for command in ("run", "plan", "profile"):
        out = ["--out", "{folder}/out"] if command != "profile" else []
        table += [(["h2", command, "--cluster", f"{{{damage}}}", *out], {}) for damage in SPEC_DAMAGES]
    table += [(["h2", "check", "--run", "{folder}"], {}),
              (["h2", "check", "--run", "{folder}", "--threshold", "nan"], {})]
    return table


def _dips_run_file(changes: dict) -> Callable[[str], str]:
    """configs/dips/local-4.yaml with `changes` (dotted names for nested fields), written in a folder."""
    import yaml

    def make(folder: str) -> str:
        with open(DIPS_RUN, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        data["out"] = os.path.join(folder, "dips-out")
        for name, value in changes.items():
            target = data
            *parents, last = name.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[last] = value
        return _write(os.path.join(folder, "run.yaml"), yaml.safe_dump(data).encode())

    return make


DIPS_FIELD_VALUES = {
    "mode": ["bogus"], "seed": [-1, 2**40], "inner_steps": [0, 2**40], "tokens": [
        -1
    ], "grace_s": [-1.0, ".nan"], "heartbeat_s": [0, -1.0, ".inf"], "missed_beats": [0], "transfer_timeout_s": [
        0, ".nan"
    ], "sync_retry_s": [-1.0], "master_port": [99999, -1], "shards": [0, 100000], "eval_sequences": [-1, 2**40],
    "outer.lr": [0, ".nan"
                 ], "outer.momentum": [1.0], "outer.optimizer": ["bogus"], "penalty.alpha": [0, 2.0], "penalty.beta": [
                     0
                 ], "penalty.clip_norm": [-1.0], "penalty.warmup_scores": [-1], "train.steps": [0], "train.lr": [
                     ".nan"
                 ], "train.micro_batches": [10**9], "clusters": [[], [{"id": "../x"}], [{"id": "a"}, {"id": "a"}],
                                                                 [{"id": "a", "step_time_s": -1.0}],
                                                                 [{"id": "a", "outlier_every": 0}]]
}


def _ps_table() -> list[tuple[list[str], dict]]:
    """h2 ps master, shard, launch and simulate: ports, counts, times and run-file fields."""
    table = []
    for name, values in DIPS_FIELD_VALUES.items():
        for value in values:
            value = {".nan": float("nan"), ".inf": float("inf")}.get(value, value) if isinstance(value, str) else value
            key = f"dips-{name}-{len(table)}"
            DAMAGED[key] = _dips_run_file({name: value})
            table.append((["h2", "ps", "master", "--config", f"{{{key}}}"], {}))
    table += [(["h2", "ps", "master", "--config", f"{{{damage}}}"], {}) for damage in SPEC_DAMAGES]
    table += [(["h2", "ps", *argv], {}) for argv in (
        ["master", "--config", DIPS_RUN, "--port", "99999"], ["master", "--config", DIPS_RUN, "--port", "-1"],
        ["master", "--config", DIPS_RUN, "--port", "x"], ["shard", "--master", "nowhere", "--index", "0"],
        ["shard", "--master", "127.0.0.1:1", "--index", "-1"],
        ["shard", "--master", "127.0.0.1:1", "--index", "0", "--control-port", "70000"],
        ["shard", "--master", "127.0.0.1:1", "--index", "0", "--data-port", "-1"],
        ["launch", "--config", DIPS_RUN, "--time-limit", "nan"],
        ["launch", "--config", DIPS_RUN, "--time-limit", "inf"], ["launch", "--config", DIPS_RUN, "--time-limit", "-1"],
        ["launch", "--config", DIPS_RUN, "--kill", "x@nan"], ["launch", "--config", DIPS_RUN, "--kill", "nobody@1"], [
            "launch", "--config", DIPS_RUN, "--resume", "--overwrite"
        ], ["simulate", "--clusters", SCENARIO, "--rounds", str(10**12)],
        ["simulate", "--clusters", SCENARIO, "--rounds", "0"], ["simulate", "--clusters", "{deep}"],
        ["simulate", "--clusters", "{duplicate}"])]
    DAMAGED["dips-shards-launch"] = _dips_run_file({"shards": 100000})
    table.append((["h2", "ps", "launch", "--config", "{dips-shards-launch}", "--time-limit", "5"], {}))
    return table


def _heteroauto_table() -> list[tuple[list[str], dict]]:
    """heteroauto search, simulate, cross-site, partition and profile."""
    search = ["heteroauto", "search", "--cluster", CAMPAIGN_CLUSTER]
    table = [([*search, *argv], {})
             for argv in (["--alpha", "nan"], ["--alpha", "2"], ["--seq-len", "0"], ["--seq-len", "-1"],
                          ["--micro-batch-size", "0"], ["--top", "0"], ["--group-size", "-1"], ["--time-limit", "nan"],
                          ["--time-limit", "-1"], ["--gap", "nan"], ["--gap", "-1"], ["--dp", "0"],
                          ["--gbs-tokens", "0"], ["--gbs-tokens", "x"], ["--gbs-sequences", "-1"],
                          ["--planner", "zorse", "--memory-fraction", "nan"],
                          ["--planner", "zorse", "--memory-fraction", "0"], ["--planner", "zorse", "--min-groups", "0"],
                          ["--planner", "zorse", "--max-groups", "0"], ["--out", "{binary}/s.yaml"])]
    for command in ("search", "partition", "profile"):
        table += [(["heteroauto", command, "--cluster", f"{{{damage}}}"], {}) for damage in SPEC_DAMAGES]
    DAMAGED["escaping-cluster"] = _escaping_cluster
    table += [(["heteroauto", "profile", "--cluster", "{escaping-cluster}", "--synthesise"], {}),
              (["heteroauto", "profile", "--cluster", CAMPAIGN_CLUSTER, "--repeats", "0"], {}),
              (["heteroauto", "profile", "--cluster", CAMPAIGN_CLUSTER, "--attempts", "0"], {}),
              (["heteroauto", "simulate", "--strategy", "{deep}"], {}),
              (["heteroauto", "simulate", "--strategy", "{duplicate}"], {}),
              (["heteroauto", "cross-site", "--scenario", "{deep}"], {}),
              (["heteroauto", "cross-site", "--scenario", XDC_SCENARIO, "--latency-ms", "nan"], {}),
              (["heteroauto", "cross-site", "--scenario", XDC_SCENARIO, "--bandwidth-gbps", "0"], {})]
    return table


def _escaping_cluster(folder: str) -> str:
    import yaml

    with open(CAMPAIGN_CLUSTER, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    data["name"] = "../../escaped"
    for chip in data["chips"]:
        if isinstance(chip.get("from"), str) and not os.path.isabs(chip["from"]):
            chip["from"] = os.path.join(os.path.dirname(CAMPAIGN_CLUSTER), chip["from"])
    return _write(os.path.join(folder, "escaping.yaml"), yaml.safe_dump(data).encode())


def _ditorch_table() -> list[tuple[list[str], dict]]:
    conformance = ["ditorch", "conformance", "--ops", "add"]
    return [([*conformance, *argv], {})
            for argv in (["--baseline", "{missing}"], ["--baseline", "{binary}"], ["--max-samples", "0"],
                         ["--max-samples", str(10**9)], ["--check-timeout", "nan"], ["--check-timeout", "0"],
                         ["--check-timeout", "-1"], ["--json", "{binary}/x.json"], ["--from-json", "{missing}"],
                         ["--dtypes", "bogus"])] + [
                             (["ditorch", "precision-diff", "{missing}", "{missing}"], {}),
                             (["ditorch", "precision-diff", "{binary}", "{binary}"], {}),
                             (["ditorch", "replay", "{missing}"], {}),
                             (["ditorch", "replay", "{folder}", "--rtol", "nan"], {}),
                         ]


def _bench_table() -> list[tuple[list[str], dict]]:
    bench = ["dicomm-bench", "--quick"]
    return [([*bench, *argv], {})
            for argv in (["--sizes", "0"], ["--sizes", "-1"], ["--sizes", str(2**70)], ["--sizes", "x"],
                         ["--sizes", ""], ["--json", "{binary}/x.json"], ["--json", "{folder}"],
                         ["--transports", "bogus"], ["--torch", "--sizes", "0"], ["--torch", "--world", "0"],
                         ["--torch", "--json", "{binary}/x"], ["--device", "dipu", "--sizes", "0"])] + [
                             ([*bench, "--sizes", "8"], {"DICOMM_TCP_CONGESTION": "bogus"}),
                             ([*bench, "--sizes", "8"], {"DICOMM_MAX_MESSAGE_BYTES": "0"}),
                             ([*bench, "--sizes", "8"], {"DICOMM_TIMEOUT_S": "nan"}),
                             ([*bench, "--sizes", "8"], {"DICOMM_TRANSPORT": "bogus"}),
                         ]


def refusal_case(entry: tuple[list[str], dict], case: Case) -> None:
    """The command as a user runs it (a process of its own, TMPDIR of its own): lost on anything but exit
    status 2 with one line on stderr and no traceback, within INPUT_TIMEOUT_S, leaving nothing behind."""
    argv, env = entry
    folder = os.path.join(case.workdir, "files")
    os.makedirs(folder)
    argv = _resolve(argv, folder)
    tmpdir = _case_tmpdir(case.workdir)
    command = [sys.executable, *PROGRAMS[argv[0]], *argv[1:]]
    what = " ".join(argv)[:160] + "".join(f" {k}={v}" for k, v in env.items())
    job = subprocess.Popen(command, cwd=folder, env={**os.environ, "TMPDIR": tmpdir, **env}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    stderr = _end(job, INPUT_TIMEOUT_S, what)
    lines = stderr.strip().splitlines()
    if job.returncode != 2 or len(lines) != 1 or "Traceback" in stderr:
        raise Lost(f"{what}: exit status {job.returncode}, stderr {lines[-3:]}")
    _check_no_leaks([], tmpdir)


INPUT_TABLES = {
    "train": _train_table(), "run": _run_table(), "ps": _ps_table(), "heteroauto": _heteroauto_table(),
    "ditorch": _ditorch_table(), "bench": _bench_table()
}

# ---- signals: the pipeline launcher stopped or killed at a random moment ------------------------------
LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGINT-group", "SIGHUP", "SIGKILL")
EXIT_STATUS = {"SIGTERM": 143, "SIGINT": 130, "SIGINT-group": 130, "SIGHUP": 129, "SIGKILL": -9}
NO_TRACES = ("Traceback", "frame #", "terminate called", "Exception raised from")


def _job_folders(tmpdir: str) -> list[str]:
    return [name for name in os.listdir(tmpdir) if name.startswith("h2-job-")]


def _launcher(out: str, tmpdir: str, steps: int) -> subprocess.Popen:
    return subprocess.Popen([
        sys.executable, "-m", "h2", "train", "--strategy", PP2, "--steps",
        str(steps), "--checkpoint-every", "0", "--rank-timeout",
        str(RANK_TIMEOUT_S), "--out", out
    ], cwd=REPO_ROOT, env={**os.environ, "TMPDIR": tmpdir}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def signals_case(case: Case) -> None:
    """SIGTERM, SIGINT (to the launcher alone, or to its group as Ctrl-C does), SIGHUP or SIGKILL to `h2
    train --strategy` during start-up or its steps: lost on a traceback or C++ stack trace, another exit
    status, a process of the job left running, or a job folder left in TMPDIR (after SIGKILL: left
    until the next launcher starts, which removes it)."""
    from test_heteropp_rank_loss import descendants

    how = LAUNCHER_SIGNALS[case.index % len(LAUNCHER_SIGNALS)]
    out, tmpdir = os.path.join(case.workdir, "run"), _case_tmpdir(case.workdir)
    job = _launcher(out, tmpdir, 10_000)
    deadline = time.monotonic() + case.timeout_s
    during_steps = case.rng.random() < 0.5
    while not (_logged_steps(out) if during_steps else _job_folders(tmpdir)):
        if job.poll() is not None or time.monotonic() > deadline:
            _end(job, 1, "the launcher")
            raise Lost(f"the job ended or stalled before the {how}: {job.returncode}")
        time.sleep(0.02)
    time.sleep(case.rng.uniform(0.0, 0.5))
    pids = [job.pid, *descendants(job.pid)]
    signum = getattr(signal, how.split("-")[0])
    (os.killpg if how.endswith("group") else os.kill)(job.pid, signum)
    stderr = _end(job, RANK_TIMEOUT_S + END_GRACE_S, f"the launcher after a {how}")
    when = "steps" if during_steps else "start-up"
    if job.returncode != EXIT_STATUS[how]:
        raise Lost(f"a {how} during {when}: exit status {job.returncode}: {stderr.strip()[-300:]}")
    traces = [mark for mark in NO_TRACES if mark in stderr]
    if traces:
        raise Lost(f"a {how} during {when}: {traces[0]!r} on stderr: {stderr.strip()[-600:]}")
    left = _killed_leftovers(pids)
    if left:
        raise Lost(f"a {how} during {when}: processes of the job left running: {left}")
    if how == "SIGKILL":
        if not _job_folders(tmpdir):
            return
        again = _launcher(os.path.join(case.workdir, "again"), tmpdir, 1)
        stderr = _end(again, case.timeout_s, "the launcher after a SIGKILLed one")
        if again.returncode != 0:
            raise Lost(f"the launcher after a SIGKILLed one failed ({again.returncode}): {stderr.strip()[-300:]}")
    _check_no_leaks(pids, tmpdir)


# ---- security: a foreign local process attacks a running Di-PS job ---------------------------------
ATTACKS = ("status", "pull", "pulled", "join", "leave", "forged-tokens", "under-ticket", "shard-register",
           "shard-control", "ticket-flood", "replay", "stale")
ATTACKER = os.path.join(REPO_ROOT, "benchmarks", "faults", "ps_attacker.py")
ALLOWED_EVENTS = {"ticket_expired"}  # all an attack may leave in the run's log (the real c1's ticket expiring)
_PS: dict = {}


def _ps_job() -> dict:
    """The Di-PS job every security case attacks, started once per campaign (tests/ps/ps_harness.py: the
    master and two shards with the run's secrets, clusters c1 and c2 listed, c1 joined with its real
    credential); stopped when the campaign ends."""
    if _PS:
        return _PS
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "ps"))
    from h2.ps.client import ClusterClient
    from ps_harness import running_ps

    folder = tempfile.mkdtemp(prefix="faults-security-")
    stack = contextlib.ExitStack()
    stack.callback(shutil.rmtree, folder, ignore_errors=True)  # last, after the servers stopped
    master, servers, address = stack.enter_context(running_ps(folder, clusters=("c1", "c2"), missed_beats=1000))
    client = ClusterClient(address, "c1", log=lambda _: None)
    stack.callback(client.close, leave=False)
    atexit.register(stack.close)  # at the family's last case, or when the campaign ends
    params = {name: value.clone() for server in servers for name, value in server.state.params.items()}
    from h2.model.transformer import Transformer

    pulled = {name: value.detach().clone() for name, value in Transformer(preset("tiny")).named_parameters()}
    client.pull_all(pulled, 0)
    _PS.update(master=master, servers=servers, address=address, client=client, folder=folder, params=params,
               pulled=pulled, data={index: shard.data for index, shard in master.shards.items()}, stack=stack)
    return _PS


def _ps_events(job: dict) -> list[dict]:
    with open(os.path.join(job["folder"], "rounds.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _captured_calls(job: dict, stale: bool, rng: random.Random) -> list[dict]:
    """Calls the real c1 signed (a Status and a Beat): sent once by c1 itself (replay), or signed with a
    timestamp outside the replay window and never sent (stale)."""
    import grpc

    from h2.ps import auth

    client = job["client"]
    signer = client.master.signer
    calls = []
    for method, request in (("Status", {}), ("Beat", {"cluster": "c1", "session": client.session})):
        body = json.dumps(request).encode()
        if stale:
            stamp, nonce = f"{time.time() + rng.choice([-1, 1]) * rng.uniform(150, 86400):.6f}", os.urandom(16).hex()
            mac = auth._mac(signer.key, b"h2-ps call", method.encode(), signer.participant.encode(), stamp.encode(),
                            nonce.encode(),
                            __import__("hashlib").sha256(body).digest())
            metadata = [(auth._HEADER_CALLER, signer.participant), (auth._HEADER_TIME, stamp),
                        (auth._HEADER_NONCE, nonce), (auth._HEADER_MAC, mac)]
        else:
            metadata = signer.sign(method, body)[0]
            channel = grpc.insecure_channel(job["address"])
            try:
                channel.unary_unary(f"/h2.ps.Control/{method}")(body, timeout=20, metadata=metadata)
            finally:
                channel.close()
        calls.append({"method": method, "body": body.decode(), "metadata": metadata})
    return calls


def _check_ps_untouched(job: dict, events_before: int, marker: float) -> None:
    """Lost when the model, a shard's staging, the master's state, a cluster's session, a shard's
    registration or the run's log changed."""
    master, servers, client = job["master"], job["servers"], job["client"]
    for server in servers:
        if server.state.version != 0:
            raise Lost(f"shard {server.state.index} is at version {server.state.version}")
        for name, value in server.state.params.items():
            if not torch.equal(value, job["params"][name]):
                raise Lost(f"shard {server.state.index}: parameter {name} changed")
        filled = {ticket: len(layers) for ticket, layers in server.state.staged.items() if layers}
        if filled or len(server.state.staged) > 1:
            raise Lost(f"shard {server.state.index} stages {dict(server.state.staged)!r:.200}")
    if master.state.version != 0 or master.state.tokens != 0 or any(p.committed for p in master.pushes.values()):
        raise Lost(f"the master's state changed: version {master.state.version}, tokens {master.state.tokens}")
    c1, c2 = master.clusters["c1"], master.clusters["c2"]
    if not c1.active or c1.session != client.session or c2.session or c2.active:
        raise Lost(f"cluster sessions changed: c1 {c1.session} active {c1.active}, c2 {c2.session} active {c2.active}")
    for index, shard in master.shards.items():
        if not shard.alive or shard.data != job["data"][index]:
            raise Lost(f"shard {index} re-registered or lost: {shard.data} alive {shard.alive}")
    new = _ps_events(job)[events_before:]
    if [e for e in new if e["event"] not in ALLOWED_EVENTS] or [e for e in new if e.get("pull_s") == marker]:
        raise Lost(f"the run's log changed: {new[:3]}")


def _check_ps_serves(job: dict) -> None:
    """The real clusters are still served: c1 beats, reads the status and pulls the model."""
    client = job["client"]
    try:
        client.master.call("Beat", cluster="c1", session=client.session)
        if set(client.master.call("Status")["clusters"]) != {"c1", "c2"}:
            raise Lost("the status a participant reads lost a cluster")
        tensors = {name: torch.zeros_like(value) for name, value in job["pulled"].items()}
        client.pull_all(tensors, 0)
    except Lost:
        raise
    except Exception as error:  # noqa: BLE001 - a server that no longer serves its participants
        raise Lost(f"the job no longer serves c1: {type(error).__name__}: {error}") from None
    changed = [name for name in tensors if not torch.equal(tensors[name], job["pulled"][name])]
    if changed:
        raise Lost(f"c1 pulled other weights than the shards hold: {changed[:3]}")


def security_case(case: Case) -> None:
    """One attack (which, its payloads and its timing drawn from the case's seed) by a process of its own
    without the run's secrets; lost when it got any answer, any state changed, or the job hangs/crashes."""
    job = _ps_job()
    attack = case.pick(list(ATTACKS))
    master, client = job["master"], job["client"]
    held = client.request_push()  # the ticket the real c1 holds while the stranger attacks
    marker = round(case.rng.uniform(1000, 2000), 3)
    spec = {
        "attack": attack, "seed": case.rng.getrandbits(32), "master": job["address"], "routes": master.routes(),
        "shard_controls": [f"127.0.0.1:{server.control_port}" for server in job["servers"]], "nbytes": [
            layer.nbytes for layer in master.layers
        ], "session": client.session, "marker": marker, "held_ticket": held.get("ticket") or 1
    }
    if attack in ("replay", "stale"):
        spec["captured"] = _captured_calls(job, attack == "stale", case.rng)
    events_before = len(_ps_events(job))
    tmpdir = _case_tmpdir(case.workdir)
    env = {key: value for key, value in os.environ.items() if not key.startswith("H2_PS")}
    attacker = subprocess.Popen([sys.executable, ATTACKER], cwd=case.workdir, env={**env, "TMPDIR": tmpdir},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = attacker.communicate(json.dumps(spec), timeout=case.timeout_s)
    except subprocess.TimeoutExpired:
        attacker.kill()
        attacker.communicate()
        raise Lost(f"{attack}: the attack did not end within {case.timeout_s:.0f} s (a hung server)") from None
    if attacker.returncode != 0:
        raise Lost(f"{attack}: the attacker failed: {stderr.strip()[-300:]}")
    got = [attempt for attempt in json.loads(stdout) if attempt["got"] in ("OK", "answered")]
    if got:
        raise Lost(f"{attack}: a stranger got an answer: {got[0]}")
    _check_ps_untouched(job, events_before, marker)
    _check_ps_serves(job)
    _check_no_leaks([], tmpdir)
    if case.index == FAMILIES["security"].cases[case.mode] - 1:
        _PS.pop("stack").close()
        _PS.clear()


# ---- checkpoint: damaged checkpoint folders, then `h2 train --resume` ---------------------------------
CKPT_STEPS, CKPT_KEEP = 6, 3
CKPT_TRAIN = [
    "train", "--preset", "tiny", "--steps",
    str(CKPT_STEPS), "--micro-batch-size", "2", "--seq-len", "32", "--warmup-steps", "1", "--checkpoint-every", "1",
    "--keep-checkpoints",
    str(CKPT_KEEP), "--quiet"
]
# shape -> how many of the newest checkpoints it damages (None: the folder as a whole)
CKPT_SHAPES = {
    "zeroed-4k": 1, "previous-shard": 1, "manifest-bit-json": 1, "manifest-bit-broken": 1, "missing-shard": 1,
    "truncated-shard": 1, "empty-step": 1, "two-newest": 2, "latest-nowhere": 0, "all-damaged": CKPT_KEEP,
    "checkpoints-a-file": None, "checkpoints-empty": None
}


def _h2(argv: list[str]) -> tuple[int, str]:
    """`h2 ARGV` in this process: (exit status, stderr); a traceback is lost."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            status = _main_of("h2")(argv)
    except SystemExit as exit_:
        status = exit_.code
    except Exception as error:  # noqa: BLE001 - a traceback for the user
        raise Lost(f"h2 {' '.join(argv[-6:])}: traceback ({type(error).__name__}: {error})") from None
    return status, stderr.getvalue()


def _losses(out: str) -> list[tuple[int, float]]:
    with contextlib.redirect_stderr(io.StringIO()):
        return [(record["step"], record["loss"]) for record in read_metrics(os.path.join(out, "metrics.jsonl"))]


def _ckpt_pristine() -> str:
    """The uninterrupted run (6 steps, a checkpoint every step, the 3 newest kept), once per campaign."""
    if "ckpt" not in _PRISTINE:
        out = os.path.join(tempfile.mkdtemp(prefix="faults-ckpt-pristine-"), "run")
        atexit.register(shutil.rmtree, os.path.dirname(out), True)
        status, stderr = _h2(CKPT_TRAIN + ["--out", out])
        if status != 0:
            raise Lost(f"the uninterrupted run failed ({status}): {stderr.strip()[-300:]}")
        _PRISTINE["ckpt"] = out
    return _PRISTINE["ckpt"]


def _flip_bit(data: bytes, rng: random.Random, keep_json: bool) -> bytes:
    """One bit flipped: inside a hex digest or a size (still valid JSON), or anywhere (mostly not)."""
    text = data.decode()
    if keep_json:
        digits = [i for i, c in enumerate(text) if c in "0123456789abcdef" and text[i - 1] not in '\\"']
        i = rng.choice(digits)
        replacement = rng.choice([c for c in "0123456789abcdef" if c != text[i]])
        return (text[:i] + replacement + text[i + 1:]).encode()
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]


def _damage_checkpoint(folder: str, previous: str, shape: str, rng: random.Random) -> None:
    shard = os.path.join(folder, shard_name(0))
    manifest = os.path.join(folder, "manifest.json")
    data = open(shard, "rb").read()
    if shape in ("zeroed-4k", "two-newest", "all-damaged"):
        start = rng.randrange(len(data) - 4096)
        _write(shard, data[:start] + b"\0" * 4096 + data[start + 4096:])
    elif shape == "previous-shard":
        shutil.copyfile(os.path.join(previous, shard_name(0)), shard)
    elif shape in ("manifest-bit-json", "manifest-bit-broken"):
        _write(manifest, _flip_bit(open(manifest, "rb").read(), rng, shape == "manifest-bit-json"))
    elif shape == "missing-shard":
        os.remove(shard)
    elif shape == "truncated-shard":
        _write(shard, data[:rng.randrange(len(data))])
    elif shape == "empty-step":
        shutil.rmtree(folder)
        os.makedirs(folder)


def checkpoint_case(case: Case) -> None:
    """One damaged-checkpoint shape on a copy of the uninterrupted run, then `h2 train --resume`: lost
    unless it resumes from the newest intact checkpoint (naming it in one line) with the loss log equal
    to the uninterrupted run's, or, when nothing is intact, refuses in one line with exit status 2."""
    pristine = _ckpt_pristine()
    shape = case.pick(list(CKPT_SHAPES))
    out = os.path.join(case.workdir, "run")
    shutil.copytree(pristine, out)
    folders = os.path.join(out, "checkpoints")
    steps = list(range(CKPT_STEPS - CKPT_KEEP + 1, CKPT_STEPS + 1))
    damaged = CKPT_SHAPES[shape]
    if shape == "latest-nowhere":
        _write(os.path.join(folders, "latest"), case.rng.choice([b"step_00000099", b"step_00000000", b"nowhere"]))
    elif shape == "checkpoints-a-file":
        shutil.rmtree(folders)
        _write(folders, b"not a folder\n")
    elif shape == "checkpoints-empty":
        shutil.rmtree(folders)
        os.makedirs(folders)
    else:
        for step in steps[::-1][:damaged]:
            _damage_checkpoint(os.path.join(folders, f"step_{step:08d}"), os.path.join(folders, f"step_{step - 1:08d}"),
                               shape, case.rng)
    intact = [step for step in steps if damaged is not None and step not in steps[::-1][:damaged]]
    status, stderr = _h2(CKPT_TRAIN + ["--out", out, "--resume"])
    lines = stderr.strip().splitlines()
    if not intact:
        if status != 2 or len(lines) != 1:
            raise Lost(f"{shape}: nothing intact, yet exit status {status}, stderr {lines[-3:]}")
        return
    if status != 0:
        raise Lost(f"{shape}: the resume failed ({status}): {lines[-3:]}")
    newest = f"step_{intact[-1]:08d}"
    said = [line for line in lines if "resuming from" in line]
    if len(said) != 1 or newest not in said[0] or "\n" in said[0]:
        raise Lost(f"{shape}: did not say it resumes from {newest}: {lines[-3:]}")
    if _losses(out) != _losses(pristine):
        raise Lost(f"{shape}: the loss log differs from the uninterrupted run's: {_losses(out)} vs {_losses(pristine)}")


# ---- concurrency: two runs started on one --out at once -------------------------------------------------
CONC_STEPS = 12
CONC_SHAPES = ("train+train", "pipeline+pipeline", "resume+resume", "train+pipeline", "run+ps-launch")
REFUSED = "another run uses this folder (pid "


def _conc_argv(kind: str, out: str, folder: str) -> list[str]:
    steps = ["--steps", str(CONC_STEPS), "--checkpoint-every", "4", "--out", out]
    if kind == "train":
        return ["train", "--preset", "tiny", "--micro-batch-size", "2", "--seq-len", "32", "--quiet", *steps]
    if kind == "resume":
        return _conc_argv("train", out, folder) + ["--resume"]
    if kind == "pipeline":
        return ["train", "--strategy", PP2, "--rank-timeout", "30", *steps]
    if kind == "run":
        sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "h2"))
        from test_run import write_cluster

        return ["run", "--cluster", write_cluster(folder), "--out", out, "--profiles", os.path.join(folder, "profiles")]
    run_file = os.path.join(folder, "run.yaml")
    _write(run_file, (f"mode: dips\nout: {out}\ntokens: 4000\ninner_steps: 2\nshards: 1\n"
                      "clusters:\n  - {id: a, step_time_s: 0.05}\n").encode())
    return ["ps", "launch", "--config", run_file, "--time-limit", "300"]


def concurrency_case(case: Case) -> None:
    """Two runs on one --out started 0-1.5 s apart (which first drawn at random): lost unless exactly one
    is refused, in one line with exit status 2 naming the other's pid, the other runs (to its end, or,
    for `h2 run`/`h2 ps launch`, until it is stopped with SIGTERM once the refusal came: it must then
    end without a traceback and leave no process), metrics.jsonl holds steps 1..n once, and nothing is
    left in TMPDIR."""
    from test_heteropp_rank_loss import descendants

    shape = case.pick(list(CONC_SHAPES))
    kinds = shape.split("+")
    case.rng.shuffle(kinds)
    out, folder, tmpdir = os.path.join(case.workdir, "run"), os.path.join(case.workdir,
                                                                          "files"), _case_tmpdir(case.workdir)
    os.makedirs(folder)
    if "resume" in kinds:
        from h2.core.run_lock import release_output_folder

        status, stderr = _h2(_conc_argv("train", out, folder) + ["--steps", "4"])
        release_output_folder(out)  # held by this process until it ends otherwise
        if status != 0:
            raise Lost(f"preparing the run to resume failed ({status}): {stderr.strip()[-300:]}")
    jobs = []
    for kind in kinds:
        jobs.append(
            subprocess.Popen([sys.executable, "-m", "h2", *_conc_argv(kind, out, folder)], cwd=folder,
                             env={**os.environ, "TMPDIR": tmpdir
                                  }, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
        time.sleep(case.rng.uniform(0.0, 1.5) if not jobs[1:] else 0)
    pids: set[int] = set()
    deadline = time.monotonic() + case.timeout_s
    while all(job.poll() is None for job in jobs) and time.monotonic() < deadline:
        pids.update(pid for job in jobs for pid in [job.pid, *descendants(job.pid)])
        time.sleep(0.05)
    first = next((i for i, job in enumerate(jobs) if job.poll() is not None), None)
    if first is None:
        for job in jobs:
            _end(job, 1, f"{shape}")
    stopping = {"run", "ps"}
    for i, job in enumerate(jobs):
        if i != first and kinds[i] in stopping and job.poll() is None:
            pids.update(descendants(job.pid))
            os.kill(job.pid, signal.SIGTERM)
    errors = [_end(job, case.timeout_s + END_GRACE_S, f"{kinds[i]} of {shape}") for i, job in enumerate(jobs)]
    refused = [i for i, job in enumerate(jobs) if job.returncode == 2 and REFUSED in errors[i]]
    if len(refused) != 1:
        raise Lost(f"{shape}: {len(refused)} refused, exit statuses {[job.returncode for job in jobs]}: "
                   f"{[e.strip()[-200:] for e in errors]}")
    loser, holder = refused[0], 1 - refused[0]
    lines = errors[loser].strip().splitlines()
    named = int(lines[0].split(REFUSED)[1].split()[0].rstrip(")"))
    if len(lines) != 1 or named not in pids or named == jobs[loser].pid:
        raise Lost(f"{shape}: the refusal is not one line naming the holder's pid: {lines[-3:]}")
    traces = [mark for mark in NO_TRACES if mark in errors[holder]]
    stopped = kinds[holder] in stopping
    if traces or (not stopped and jobs[holder].returncode != 0):
        raise Lost(f"{shape}: the holder ({kinds[holder]}) ended {jobs[holder].returncode}: "
                   f"{errors[holder].strip()[-300:]}")
    left = _killed_leftovers(pids)
    if left:
        raise Lost(f"{shape}: processes left running: {left}")
    if not stopped:
        _check_final_run(out, CONC_STEPS)
    _check_no_leaks(pids, tmpdir)


# ---- disk-full: a small tmpfs as --out, filled up while the run checkpoints ------------------------------
DISK_STEPS = 4
# tmpfs sizes in KiB: below one checkpoint (the start-up check refuses), about the start-up check's estimate
# (the later checkpoints may not fit), room for every checkpoint (a filler then takes the free space)
DISK_SIZES_K = (1024, 7000, 8200, 9000, 12000, 40000)
DISK_SHAPES = [(kind, size) for kind in ("train", "pipeline") for size in DISK_SIZES_K]
ENOSPC_TEXT = "No space left on device (ENOSPC)"
# inside the case's own mount namespace: mount the tmpfs, run, fill the file system once checkpoint FILL_AFTER
# is complete (0: never), then copy the run folder out to the case's folder (the tmpfs ends with the namespace)
DISK_SCRIPT = r"""
set -u
mount -t tmpfs -o size="$SIZE"k tmpfs "$MNT" || exit 97
"$@" > "$CASE/stdout" 2> "$CASE/stderr" &
run=$!
if [ "$FILL_AFTER" -gt 0 ]; then
  manifest=$(printf "%s/run/checkpoints/step_%08d/manifest.json" "$MNT" "$FILL_AFTER")
  while kill -0 $run 2>/dev/null && [ ! -e "$manifest" ]; do sleep 0.02; done
  dd if=/dev/zero of="$MNT/filler" bs=4k 2>/dev/null
fi
wait $run
echo $? > "$CASE/status"
rm -f "$MNT/filler"
cp -a "$MNT/run" "$CASE/copy" 2>/dev/null
exit 0
"""


def _disk_argv(kind: str, out: str) -> list[str]:
    common = ["--steps", str(DISK_STEPS), "--checkpoint-every", "1", "--keep-checkpoints", "2", "--out", out]
    if kind == "train":
        return ["train", "--preset", "tiny", "--micro-batch-size", "2", "--seq-len", "32", "--quiet", *common]
    return ["train", "--strategy", PP2, "--p2p-backend", "dicomm", "--rank-timeout", "30", *common]


def disk_full_case(case: Case) -> None:
    """`h2 train` or a pipeline whose --out is a real tmpfs of the drawn size, in a mount namespace of the
    case's own, its free space taken once a drawn checkpoint is complete: lost unless the run finishes
    (exit 0, every step), or the start-up check refuses it (exit 2, one line), or it ends with exit 1 and
    one line naming the file and ENOSPC, with the previous checkpoint intact and loadable and no
    temporary left; a traceback, a hang or anything left in TMPDIR is lost too."""
    kind, size = case.pick(DISK_SHAPES)
    fill_after = case.rng.randint(0, DISK_STEPS - 1)
    mnt = os.path.join(case.workdir, "mnt")
    os.makedirs(mnt)
    tmpdir = _case_tmpdir(case.workdir)
    out = os.path.join(mnt, "run")
    env = {
        **os.environ, "TMPDIR": tmpdir, "SIZE": str(size), "MNT": mnt, "CASE": case.workdir,
        "FILL_AFTER": str(fill_after)
    }
    what = f"{kind} on a {size} KiB tmpfs filled after checkpoint {fill_after}"
    job = subprocess.Popen([
        "unshare", "-m", "--propagation", "private", "sh", "-c", DISK_SCRIPT, "disk-full", sys.executable, "-m", "h2",
        *_disk_argv(kind, out)
    ], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _end(job, case.timeout_s + END_GRACE_S, what)
    if job.returncode != 0 or not os.path.exists(os.path.join(case.workdir, "status")):
        raise Lost(f"{what}: the namespace's script failed ({job.returncode}); is this root with unshare?")
    status = int(open(os.path.join(case.workdir, "status")).read())
    stderr = open(os.path.join(case.workdir, "stderr")).read()
    lines = stderr.strip().splitlines()
    copy = os.path.join(case.workdir, "copy")
    traces = [mark for mark in NO_TRACES if mark in stderr]
    if traces:
        raise Lost(f"{what}: {traces[0]!r} on stderr: {stderr.strip()[-400:]}")
    if status == 0:
        _check_final_run(copy, DISK_STEPS)
    elif status == 2:
        if len(lines) != 1 or "free" not in lines[0]:
            raise Lost(f"{what}: exit 2 but not the start-up check's one line: {lines[-3:]}")
    elif status == 1:
        failed = [line for line in lines if ENOSPC_TEXT in line]
        if kind == "train" and len(lines) != 1 or not failed or f"{out}/checkpoints/" not in failed[0]:
            raise Lost(f"{what}: exit 1 without one line naming the file and ENOSPC: {lines[-4:]}")
        if _temporaries(copy):
            raise Lost(f"{what}: temporaries left: {_temporaries(copy)}")
        if CheckpointDir(copy).complete_steps():
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    CheckpointDir(copy).load_latest(say=lambda line: None)
            except UserError as error:
                raise Lost(f"{what}: the previous checkpoint does not load: {error}") from None
    else:
        raise Lost(f"{what}: exit status {status}: {lines[-3:]}")
    _check_no_leaks([], tmpdir)


# ---- the existing families, registered ------------------------------------------------------------
@family("kill", quick=3, full=30)
def _kill(case: Case) -> None:
    kill_case(case.rng, case.workdir, case.timeout_s)


@family("torn", quick=4, full=60)
def _torn(case: Case) -> None:
    torn_case(case.rng, case.workdir, case.timeout_s)


@family("cli", quick=12, full=len(BAD_CLI))
def _cli(case: Case) -> None:
    cli_case(case.pick(BAD_CLI), case.workdir)


@family("frame", quick=40, full=360)
def _frame(case: Case) -> None:
    frame_case(case.rng)


@family("ranks", quick=1, full=6)
def _ranks(case: Case) -> None:
    ranks_case(case.rng, case.workdir, case.timeout_s, case.index)


@family("dicomm", quick=6, full=36)
def _dicomm(case: Case) -> None:
    dicomm_case(case.rng, case.workdir, case.timeout_s, case.index)


# ---- bad input per command: each refused in one line with exit 2, before any work --------------------
@family("input-yaml", quick=6, full=len(YAML_CASES))
def _input_yaml(case: Case) -> None:
    loader_case(*case.pick(YAML_CASES), case.workdir)


for _name, _table in INPUT_TABLES.items():
    family(f"input-{_name}", quick=1, full=len(_table))(lambda case, table=_table: refusal_case(case.pick(table), case))


@family("signals", quick=1, full=2 * len(LAUNCHER_SIGNALS))
def _signals(case: Case) -> None:
    signals_case(case)


@family("security", quick=3, full=5 * len(ATTACKS))
def _security(case: Case) -> None:
    security_case(case)


@family("checkpoint", quick=2, full=4 * len(CKPT_SHAPES))
def _checkpoint(case: Case) -> None:
    checkpoint_case(case)


@family("concurrency", quick=1, full=3 * len(CONC_SHAPES))
def _concurrency(case: Case) -> None:
    concurrency_case(case)


@family("disk-full", quick=1, full=len(DISK_SHAPES))
def _disk_full(case: Case) -> None:
    disk_full_case(case)


# ---- the campaign --------------------------------------------------------------------------------
def run(mode: str, seed: int, timeout_s: float, show=print, only: list[str] | None = None) -> dict[str, dict[str, int]]:
    rng = random.Random(seed)
    counts: dict[str, dict[str, int]] = {}
    for name, entry in FAMILIES.items():
        if only and name not in only:
            continue
        tally = counts.setdefault(name, {"tried": 0, "survived": 0, "lost": 0})
        started = time.perf_counter()
        for index in range(entry.cases[mode]):
            workdir = tempfile.mkdtemp(prefix=f"faults-{name}-")
            try:
                entry.run(Case(rng, workdir, timeout_s, index, mode))
                tally["survived"] += 1
            except Lost as lost:
                tally["lost"] += 1
                show(f"  lost: {name} case {index}: {lost}")
            finally:
                tally["tried"] += 1
                shutil.rmtree(workdir, ignore_errors=True)
        show(f"{name:16s} tried {tally['tried']:4d}  survived {tally['survived']:4d}  lost {tally['lost']:4d}  "
             f"({time.perf_counter() - started:.1f} s)")
    total = {key: sum(tally[key] for tally in counts.values()) for key in ("tried", "survived", "lost")}
    show(f"total  tried {total['tried']:4d}  survived {total['survived']:4d}  lost {total['lost']:4d}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take before it counts as hung")
    parser.add_argument("--json", metavar="FILE", help="also write the counts as JSON")
    parser.add_argument("--families", help=f"comma-separated families to run (default all: {', '.join(FAMILIES)})")
    parser.add_argument("--list", action="store_true", help="print each family's cases per mode and exit")
    args = parser.parse_args(argv)
    if args.list:
        for entry in FAMILIES.values():
            print(f"{entry.name:16s} quick {entry.cases['quick']:4d}  full {entry.cases['full']:4d}")
        print(f"{'total':16s} quick {sum(f.cases['quick'] for f in FAMILIES.values()):4d}  "
              f"full {sum(f.cases['full'] for f in FAMILIES.values()):4d}")
        return 0
    only = args.families.split(",") if args.families else None
    unknown = [name for name in only or [] if name not in FAMILIES]
    if unknown:
        parser.error(f"--families: no family {unknown[0]} (have {', '.join(FAMILIES)})")
    # Started in the background by a shell without job control (`... &`), this process ignores SIGINT and
    # SIGQUIT, and so would every process it starts: the signals family's SIGINT would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    print(f"fault campaign, {args.mode} mode, seed {args.seed}, load {os.getloadavg()[0]:.1f}")
    counts = run(args.mode, args.seed, args.timeout, only=only)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(counts, handle, indent=1)
    return 1 if any(tally["lost"] for tally in counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
