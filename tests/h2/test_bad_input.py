"""Bad input to every command is refused in one line naming the flag, field or file, with exit status 2,
before any work starts: no run folder, no profile, no process, a prompt return (issue 34)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from h2.core.model_config import preset

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIPS_RUN = os.path.join(REPO_ROOT, "configs", "dips", "local-4.yaml")
SCENARIO = os.path.join(REPO_ROOT, "configs", "dips", "paper-table1.yaml")
PROMPT_S = 60.0  # a refusal comes before any work: far less than a profile, a run or a simulation takes

# A cluster file for `h2 run` (two emulated chips, tiny model): what `h2 run` would profile and train.
CLUSTER = {
    "name": "bad-input", "model": "tiny", "chips": [{
        "name": name, "count": 1, "memory_gb": memory, "chips_per_node": 1, "tp_max": 1, "intra_node_gbps": 2,
        "inter_node_gbps": 1, "peak_tflops": 0.02, "emulation": {"relative_speed": 0.2}
    } for name, memory in (("emu-big", 0.008), ("emu-small", 0.004))],
    "training": {"seq_len": 32, "global_batch_sequences": 4, "micro_batch_size": 2, "zero1": False}
}


def write(path, text: str) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return str(path)


def dips_run(folder, name: str, **changes) -> str:
    """configs/dips/local-4.yaml with `changes`, its out inside `folder`."""
    with open(DIPS_RUN, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    data.update(out=str(folder / "dips-out"), **changes)
    return write(folder / f"{name}.yaml", yaml.safe_dump(data))


def inputs(folder) -> dict[str, str]:
    """The files the cases name, written into `folder`."""
    os.mkfifo(folder / "fifo.yaml")
    reference = folder / "reference"
    reference.mkdir()
    write(reference / "plan.json", json.dumps({"model": "tiny", "model_config": preset("tiny").to_dict()}))
    write(reference / "metrics.jsonl", "".join(json.dumps({"step": s, "loss": 5.0 - s / 10}) + "\n" for s in (1, 2, 3)))
    return {
        "deep": write(folder / "deep.yaml", "steps: " + "[" * 5000 + "]" * 5000 + "\n"),
        "duplicate": write(folder / "duplicate.yaml", "steps: 1\nlr: 0.001\nsteps: 2\n"),
        "fifo": str(folder / "fifo.yaml"),
        "shards": dips_run(folder, "shards", shards=100000),
        "no_clusters": dips_run(folder, "no-clusters", clusters=[]),
        "cluster": write(folder / "cluster.yaml", yaml.safe_dump(CLUSTER)),
        "escaping_cluster": write(folder / "escaping.yaml", yaml.safe_dump({**CLUSTER, "name": "../../escaped"})),
        "escaping_model": write(folder / "escaping-model.yaml", "preset: tiny\nname: ../../escaped\n"),
        "escaping_cluster_model": write(folder / "escaping-model-cluster.yaml",
                                        yaml.safe_dump({**CLUSTER, "model": str(folder / "escaping-model.yaml")})),
        "reference": str(reference),
        "out": str(folder / "out"),
    }


# (argv with {names} of `inputs`, what the one line must name)
ESCAPING_MODEL = "escaping-model.yaml: model: field 'name' must be 1-100 letters"  # its name would be a cache path
TRAIN = [
    (["train", "--micro-batches", "1000000000"], "'micro_batches' out of range"),
    (["train", "--lr", "inf"], "argument --lr: expected a finite number"),
    (["train", "--lr", "nan"], "argument --lr: expected a finite number"),
    (["train", "--warmup-steps", str(2**63)], "'warmup_steps' out of range"),
    (["train", "--steps", str(2**40)], "'steps' out of range"),
    (["train", "--eval-every", str(2**63)], "'eval_every' out of range"),  # found by the full campaign
    (["train", "--eval-batches", str(2**63)], "'eval_batches' out of range"),
    (["train", "--preset", ""], "--preset is empty"),
    (["train", "--outlier-scale", "inf", "--ps", "127.0.0.1:1", "--cluster-id", "a"], "--outlier-scale"),
    (["train", "--outlier-scale", "nan", "--ps", "127.0.0.1:1", "--cluster-id", "a"], "--outlier-scale"),
    (["train", "--pace-step-s", "1e300", "--ps", "127.0.0.1:1", "--cluster-id", "a"], "--pace-step-s"),
    (["train", "--config", "{deep}"], "nested deeper than 64 levels"),
    (["train", "--config", "{duplicate}"], "duplicate key 'steps'"),
    (["train", "--config", "/proc/self/mem"], "/proc/self/mem: cannot read"),
    (["train", "--config", "{fifo}"], "not a regular file"),
    (["train", "--config", "/dev/zero"], "/dev/zero: not a regular file"),
    (["train", "--model-config", "{escaping_model}"], ESCAPING_MODEL),
]
PS = [
    (["ps", "master", "--config", DIPS_RUN, "--port", "99999"], "argument --port"),
    (["ps", "master", "--config", DIPS_RUN, "--port", "-1"], "argument --port"),
    (["ps", "master", "--config", "{no_clusters}"], "field 'clusters' lists no cluster"),
    (["ps", "shard", "--master", "127.0.0.1:1", "--index", "0", "--data-port", "70000"], "argument --data-port"),
    (["ps", "launch", "--config", "{shards}"], "field 'shards' must be at most 256"),
    (["ps", "launch", "--config", DIPS_RUN, "--time-limit", "nan"], "argument --time-limit"),
    (["ps", "launch", "--config", DIPS_RUN, "--time-limit", "inf"], "argument --time-limit"),
    (["ps", "launch", "--config", DIPS_RUN, "--time-limit", "-1"], "--time-limit must be 0"),
    (["ps", "launch", "--config", DIPS_RUN, "--kill", "master@nan"], "--kill 'master@nan'"),
    (["ps", "simulate", "--clusters", SCENARIO, "--rounds",
      str(10**12)], "argument --rounds"),
]
RUN_FLAGS = [
    (["--steps", "0"], "'steps' out of range"),
    (["--lr", "inf"], "argument --lr"),
    (["--lr", "-1"], "'lr' out of range"),
    (["--seed", "-1"], "'seed' out of range"),
    (["--threshold", "0"], "--threshold must be a positive number"),
    (["--threshold", "nan"], "argument --threshold"),
    (["--max-restarts", "-1"], "--max-restarts must be at least 0"),
    (["--keep-checkpoints", "0"], "'keep_checkpoints' out of range"),
    (["--rank-timeout", "0"], "--rank-timeout must be positive"),
    (["--rdzv-endpoint", "nowhere"], "--rdzv-endpoint: expected HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "host:99999"], "--rdzv-endpoint: expected HOST:PORT"),
    (["--steps", "2", "--reference", "{reference}"], "its curve runs to step 3, this run trains to step 2"),
]
RUN = [(["run", "--cluster", "{cluster}", "--out", "{out}", *flags], expected) for flags, expected in RUN_FLAGS] + [
    (["run", "--cluster", "{cluster}", "--out", "/proc/h2-bad-input/out"], "--out /proc/h2-bad-input/out"),
    (["run", "--cluster", "{escaping_cluster}", "--out", "{out}"], "field 'name' must be"),
    (["run", "--cluster", "{cluster}", "--model", "{escaping_model}", "--out", "{out}"], ESCAPING_MODEL),
    (["run", "--cluster", "{escaping_cluster_model}", "--out", "{out}"], ESCAPING_MODEL),
    (["plan", "--cluster", "{cluster}", "--out", "/proc/h2-bad-input/out"], "--out /proc/h2-bad-input/out"),
]


def refused(argv: list[str], folder, module: str = "h2", env: dict | None = None) -> str:
    """Run `python -m module argv` in `folder` (its TMPDIR inside it); the one line on stderr of a
    refusal, after checking exit status 2, no traceback, a prompt return and nothing written."""
    before = sorted(os.listdir(folder)), sorted(os.listdir(folder.parent))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", module, *argv], cwd=folder, capture_output=True, text=True,
                            timeout=PROMPT_S * 2, env={**os.environ, **(env or {})})
    took = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-2000:])
    assert took < PROMPT_S, f"refused only after {took:.0f} s"
    assert (sorted(os.listdir(folder)), sorted(os.listdir(folder.parent))) == before, "the refusal wrote files"
    return lines[0]


@pytest.fixture
def folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    return work, inputs(tmp_path)


@pytest.mark.parametrize("argv, expected", TRAIN + PS + RUN, ids=lambda case: " ".join(case)
                         if isinstance(case, list) else None)
def test_bad_input_is_refused_in_one_line_before_any_work(folder, argv, expected):
    work, files = folder
    line = refused([part.format(**files) for part in argv], work)
    assert line.startswith("h2: error: ") and expected in line, line


def test_h2_run_validates_its_whole_job_before_profiling(folder):
    """The refusal comes before the profile cache or the run folder exist."""
    work, files = folder
    profiles = os.path.join(str(work.parent), "profiles")
    line = refused(["run", "--cluster", files["cluster"], "--out", files["out"], "--profiles", profiles, "--lr", "-1"],
                   work)
    assert "'lr' out of range" in line
    assert not os.path.exists(profiles) and not os.path.exists(files["out"])


def test_ditorch_conformance_reads_its_baseline_before_the_checks_run(folder):
    line = refused(["conformance", "--baseline", "/nonexistent.json"], folder[0], module="h2.cli.ditorch")
    assert line == "ditorch: error: /nonexistent.json: cannot read (No such file or directory)"
