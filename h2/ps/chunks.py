"""The training data of a Di-PS run pre-partitioned into many chunks the master hands out (Di-PS section 3:
clusters that join and leave keep a balanced stream).

An epoch of the run's sequence stream (W windows, h2.data.stream) is cut into C = chunks_per_cluster x
clusters contiguous ranges of global sequences; chunk c of epoch e is [e W + c W // C, e W + (c + 1) W // C).
The master's `ChunkLedger` hands out the chunks of an epoch in order, each once, to whichever cluster asks
(a faster cluster asks more often, so it reads more); once every chunk of the epoch is handed out the next
epoch starts (its own permutation of the windows). A chunk is never handed out twice in an epoch: a cluster
that leaves or is dropped in the middle of a chunk leaves the rest of it unread in that epoch. On the
cluster's side `ChunkStream` reads its chunks in order and asks for the next one when one runs out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from h2.core.errors import UserError
from h2.data import SequenceStream


@dataclass
class Chunk:
    epoch: int
    index: int
    count: int  # chunks per epoch

    def span(self, windows: int) -> tuple[int, int]:
        """Global sequence indices [first, end) of this chunk in a stream of `windows` windows per epoch."""
        base = self.epoch * windows
        return base + self.index * windows // self.count, base + (self.index + 1) * windows // self.count


@dataclass
class ChunkLedger:
    """The master's record of the chunks handed out: the epoch and the next chunk of it."""
    count: int
    epoch: int = 0
    next: int = 0

    def take(self) -> Chunk:
        if self.next >= self.count:
            self.epoch, self.next = self.epoch + 1, 0
        chunk = Chunk(self.epoch, self.next, self.count)
        self.next += 1
        return chunk

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "next": self.next}


class ChunkStream:
    """A cluster's training stream over the chunks the master hands it (`next_chunk`); otherwise like the
    SequenceStream it wraps (its corpus, sequence length and checkpointed state)."""

    def __init__(self, stream: SequenceStream, next_chunk: Callable[[], Chunk]):
        self.stream, self.next_chunk = stream, next_chunk
        self.corpus, self.seq_len = stream.corpus, stream.seq_len
        self.chunks: list[Chunk] = []  # every chunk this stream read from, in order
        self.cursor = self.end = 0

    def _refill(self) -> None:
        chunk = self.next_chunk()
        if self.stream.num_windows < chunk.count:
            raise UserError(
                f"Di-PS run file: {chunk.count} chunks per epoch but the corpus has only "
                f"{self.stream.num_windows} sequences of {self.seq_len + 1} tokens: lower chunks_per_cluster")
        self.chunks.append(chunk)
        self.cursor, self.end = chunk.span(self.stream.num_windows)

    def next_batch(self, global_batch: int, dp_rank: int = 0, dp_size: int = 1) -> torch.Tensor:
        if (dp_rank, dp_size) != (0, 1):
            raise ValueError("a Di-PS cluster reading chunks reads whole batches (data partition 0 of 1)")
        parts, wanted = [], global_batch
        while wanted:
            if self.cursor >= self.end:
                self._refill()
            take = min(wanted, self.end - self.cursor)
            parts.append(self.stream.sequences(self.cursor, take))
            self.cursor, wanted = self.cursor + take, wanted - take
        self.stream.position += global_batch
        return torch.cat(parts)

    def sequences(self, first: int, count: int) -> torch.Tensor:
        return self.stream.sequences(first, count)

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)
