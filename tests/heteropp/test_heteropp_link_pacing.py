"""Cross-stage traffic crosses its emulated link: gloo sends paced in HeteroPP's P2P, and a pipeline
launched with `h2 train --strategy S --cluster C` whose slow link class shows in its step time."""

from __future__ import annotations

import json
import time

import pytest

from h2.core.links import Link
from h2.core.ranks import run_ranks

LINK = Link(bandwidth_gbps=0.1, latency_us=50_000)
MESSAGE_BYTES = 2_000_000


def _paced_transfer(rank: int, world_size: int, link: Link, nbytes: int) -> dict:
    """Rank 0 sends one message through a paced P2P; rank 1 times its arrival from a barrier."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from heteropp.p2p import P2P
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        p2p = P2P(link_to=lambda peer: link)
        tensor = torch.zeros(nbytes, dtype=torch.uint8)
        dist.barrier()
        started = time.perf_counter()
        if rank == 0:
            p2p.send(tensor, dst=1, group=None, tag=7)
            posting_s = time.perf_counter() - started
            p2p.wait_sends()
            return {"posting_s": posting_s}
        p2p.recv(tensor, src=0, group=None, tag=7).wait()
        return {"arrival_s": time.perf_counter() - started}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def paced():
    return run_ranks(_paced_transfer, 2, (LINK, MESSAGE_BYTES), timeout=120, start_method="forkserver",
                     preload=["torch", "heteropp"])


def test_a_paced_gloo_send_arrives_no_sooner_than_latency_plus_bytes_over_bandwidth(paced):
    # 0.9: the two ranks leave the barrier up to a few milliseconds apart
    assert paced[1]["arrival_s"] >= 0.9 * LINK.seconds(MESSAGE_BYTES)


def test_a_paced_gloo_send_does_not_block_the_sender(paced):
    assert paced[0]["posting_s"] < LINK.latency_s / 2


CLUSTER = """\
chips:
  - {name: fast, emulated: true, count: 1, memory_gb: 1, chips_per_node: 1, tp_max: 1, intra_node_gbps: 10,
     inter_node_gbps: 10, latency_us: 10}
  - {name: slow, emulated: true, count: 1, memory_gb: 1, chips_per_node: 1, tp_max: 1, intra_node_gbps: 10,
     inter_node_gbps: 10, latency_us: 10}
links:
  inter_type: {bandwidth_gbps: 0.05, latency_us: 150000}
"""
STRATEGY = """\
dp: 1
micro_batches: 2
micro_batch_size: 2
seq_len: 32
model: tiny
stages:
  - {chip: fast, tp: 1, layers: 2}
  - {chip: slow, tp: 1, layers: 2}
"""


@pytest.mark.slow
@pytest.mark.parametrize("p2p_backend", ["gloo", "dicomm"])
def test_a_slow_link_class_between_stages_shows_in_every_step(tmp_path, cli, p2p_backend):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "s.yaml").write_text(STRATEGY)
    out = tmp_path / "run"
    result = cli("h2", "train", "--strategy", str(tmp_path / "s.yaml"), "--cluster", str(tmp_path / "c.yaml"),
                 "--p2p-backend", p2p_backend, "--steps", "3", "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "link stage 0 -> 1 (emulated): inter_type 0.05 GB/s, 150000 us" in result.stdout
    with open(out / "metrics.jsonl") as handle:
        steps = [json.loads(line)["step_time_s"] for line in handle]
    # An activation crosses forward and its gradient back on the critical path: two latencies at least.
    # Step 1 is left out (the last stage may start it after the first stage already sent), and 0.9
    # allows for the ranks leaving the previous step's all-reduce a few milliseconds apart.
    assert min(steps[1:]) >= 0.9 * 2 * 0.150


def test_h2_train_with_a_bad_link_in_the_cluster_is_one_line_exit_2_before_any_rank_starts(tmp_path, cli):
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("latency_us: 150000", "latency_us: -1"))
    (tmp_path / "s.yaml").write_text(STRATEGY)
    result = cli("h2", "train", "--strategy", str(tmp_path / "s.yaml"), "--cluster", str(tmp_path / "c.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"error: {tmp_path / 'c.yaml'}: links.inter_type: field 'latency_us' "
                                          f"must not be negative, got -1.0")
    assert result.stderr.strip().count("\n") == 0
