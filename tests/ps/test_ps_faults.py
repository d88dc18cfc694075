"""Faults in a whole local run (`h2 ps launch`): a cluster, a shard and the master are killed, a shard
dies while preparing a round; the run goes on, names every event, and resumes with one command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow

RUN = """
mode: dips
inner_steps: 2
tokens: {tokens}
grace_s: 0.1
heartbeat_s: 0.3
missed_beats: 3
transfer_timeout_s: 5
shards: 2
eval_sequences: 4
out: {out}
train: {{steps: 100000, micro_batch_size: 4, lr: 0.003, min_lr: 0.003, warmup_steps: 2, checkpoint_every: 4}}
clusters:
  - {{id: a, step_time_s: 0.05}}
  - {{id: b, step_time_s: 0.05}}
"""


def write_run(tmp_path, tokens: int) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(RUN.format(tokens=tokens, out=tmp_path / "out"))
    return str(path)


def events(tmp_path) -> list[dict]:
    with open(tmp_path / "out" / "rounds.jsonl") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def launch(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "h2.cli.main", "ps", "launch", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:  # name where the run stood, not only that it timed out
        output = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) else expired.stdout
        pytest.fail(f"h2 ps launch ran past {timeout} s; its output ended with:\n{(output or '')[-4000:]}")


def test_killing_a_cluster_a_shard_and_the_master_mid_run_is_survived_and_logged(tmp_path):
    result = launch("--config", write_run(tmp_path, 9000), "--kill", "cluster-b@r2", "--kill", "shard-1@r4", "--kill",
                    "master@r6", "--shard-crash-at-round", "9")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = events(tmp_path)
    kinds = [(e["event"], e.get("cluster", e.get("shard"))) for e in log]
    assert ("drop", "b") in kinds and any(e["event"] == "join" and e["cluster"] == "b" and e["rejoin"] for e in log)
    assert ("shard_lost", 1) in kinds and any(e["event"] == "shard" and e["shard"] == 1 and e["rejoin"] for e in log)
    assert sum(1 for e in log if e["event"] == "start") == 2
    assert any(e["event"] == "skip" and e["round"] == 9 for e in log)
    assert log[-1]["event"] == "stop" or any(e["event"] == "round" and e["finished"] for e in log)
    for name in ("cluster-b", "shard-1", "master"):
        assert f"fault injection: killed {name}" in result.stdout and f"restarted {name}" in result.stdout
    syncs = [
        json.loads(line) for c in ("a", "b")
        for line in (tmp_path / "out" / "clusters" / c / "ps.jsonl").read_text().splitlines()
    ]
    retried = [(s["step"], t["status"]) for s, t in zip(syncs, syncs[1:])
               if s["status"] == "skipped" and t["step"] == s["step"] and t["status"] != "joined"]
    assert retried, "no skipped sync point was tried again at the same step"


def test_a_stopped_run_resumes_from_the_ps_snapshot_with_one_command(tmp_path):
    config = write_run(tmp_path, 6000)
    first = subprocess.Popen([sys.executable, "-m", "h2.cli.main", "ps", "launch", "--config", config], cwd=REPO_ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if os.path.exists(tmp_path / "out" / "rounds.jsonl") and \
                sum(1 for e in events(tmp_path) if e["event"] == "round") >= 3:
            break
        time.sleep(0.5)
    first.send_signal(signal.SIGTERM)
    first.wait(60)
    stopped_at = max(e["version"] for e in events(tmp_path) if e["event"] == "round")
    refused = launch("--config", config)
    assert refused.returncode == 2 and "pass --resume to continue it or --overwrite" in refused.stderr
    result = launch("--config", config, "--resume")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = events(tmp_path)
    restart = max(i for i, e in enumerate(log) if e["event"] == "start")
    assert log[restart]["version"] == stopped_at
    assert [e["version"] for e in log[restart:] if e["event"] == "round"][0] == stopped_at + 1
    assert any(e["event"] == "round" and e["finished"] for e in log[restart:])
