"""Data in chunks handed out by the real master (in-process): no chunk is read twice in an epoch while
clusters leave and join, and a cluster's stream reads exactly the sequences of the chunks it was handed."""

import json

import numpy as np
import pytest
import torch

from h2.core.dips import ClusterSpec, DipsConfig, PSOptions, check_dips_config
from h2.core.errors import UserError
from h2.core.model_config import preset
from h2.core.training import TrainConfig
from h2.data import SequenceStream
from h2.data.corpus import Corpus
from h2.ps.chunks import ChunkStream
from h2.ps.client import ClusterClient
from h2.train.ps_sync import run_with_ps
from h2.train.trainer import Trainer
from ps_harness import running_ps


def chunk_events(out_dir) -> list[dict]:
    events = [json.loads(line) for line in open(out_dir / "rounds.jsonl")]
    return [event for event in events if event["event"] == "chunk"]


def test_no_chunk_is_handed_out_twice_in_an_epoch_across_a_cluster_leaving_and_joining(tmp_path):
    with running_ps(tmp_path, clusters=("a", "b", "c"), chunks_per_cluster=2) as (_, _, address):
        a, b = (ClusterClient(address, cid, log=lambda _: None) for cid in ("a", "b"))
        handed = [("a", a.next_chunk()), ("b", b.next_chunk()), ("a", a.next_chunk())]
        a.close()  # a leaves in the middle of its chunk
        c = ClusterClient(address, "c", log=lambda _: None)
        handed += [("c", c.next_chunk()), ("b", b.next_chunk())]
        a = ClusterClient(address, "a", log=lambda _: None)  # a joins again
        handed += [(cid, client.next_chunk()) for _ in range(3) for cid, client in (("a", a), ("c", c))]
        for client in (a, b, c):
            client.close()
    by_epoch = {}
    for _, chunk in handed:
        by_epoch.setdefault(chunk.epoch, []).append(chunk.index)
    assert by_epoch == {0: [0, 1, 2, 3, 4, 5], 1: [0, 1, 2, 3, 4]}
    assert {chunk.count for _, chunk in handed} == {6}
    assert [(e["cluster"], e["epoch"], e["chunk"]) for e in chunk_events(tmp_path)] == [(cid, chunk.epoch, chunk.index)
                                                                                        for cid, chunk in handed]


def test_two_clusters_streams_read_exactly_their_chunks_and_the_faster_one_reads_more(tmp_path):
    corpus = Corpus(np.arange(40 * 8 + 1), "numbers", "test")  # 40 distinct windows of 8 + 1 tokens
    with running_ps(tmp_path, clusters=("a", "b"), chunks_per_cluster=4) as (_, _, address):
        clients = [ClusterClient(address, cid, log=lambda _: None) for cid in ("a", "b")]
        streams = [ChunkStream(SequenceStream(corpus, 8, seed=0), client.next_chunk) for client in clients]
        batches = {0: [], 1: []}
        for _ in range(3):
            for which in (0, 1, 0):  # a reads twice as fast as b: 27 of the epoch's 40 sequences
                batches[which].append(streams[which].next_batch(3))
        for client in clients:
            client.close()
    read = [{(chunk.epoch, chunk.index) for chunk in stream.chunks} for stream in streams]
    assert not read[0] & read[1] and len(read[0]) > len(read[1])
    windows = streams[0].stream.num_windows
    for which, stream in enumerate(streams):
        expected = torch.cat([stream.stream.sequences(*_first_count(chunk, windows)) for chunk in stream.chunks])
        got = torch.cat(batches[which])
        torch.testing.assert_close(got, expected[:len(got)])
    rows = [{tuple(row.tolist()) for batch in batches[which] for row in batch} for which in batches]
    assert len(rows[0]) + len(rows[1]) == 27 and not rows[0] & rows[1]  # distinct windows, none read twice


def _first_count(chunk, windows: int) -> tuple[int, int]:
    first, end = chunk.span(windows)
    return first, end - first


def test_chunks_are_refused_for_a_cluster_that_runs_a_strategy():
    config = DipsConfig(chunks_per_cluster=4, clusters=[ClusterSpec(id="a", strategy="s.yaml")])
    with pytest.raises(UserError, match=r"clusters\[0\].strategy'.*chunks_per_cluster"):
        check_dips_config(config, "run.yaml")


def test_a_cluster_trainer_reads_the_chunks_the_master_hands_it(tmp_path):
    config = TrainConfig(steps=4, checkpoint_every=0, micro_batch_size=4)
    with running_ps(tmp_path / "ps", clusters=("solo", ), mode="sync", inner_steps=2, eval_sequences=0,
                    chunks_per_cluster=64) as (_, _, address):
        trainer = Trainer(preset("tiny"), config, str(tmp_path / "cluster"), show_progress=False)
        records = run_with_ps(trainer, PSOptions(ps=address, cluster_id="solo"), show_progress=False,
                              log=lambda _: None)
    assert len(records) == 4 and isinstance(trainer.stream, ChunkStream)
    handed = [(e["epoch"], e["chunk"]) for e in chunk_events(tmp_path / "ps")]
    assert handed == [(c.epoch, c.index) for c in trainer.stream.chunks] and handed[0] == (0, 0)
