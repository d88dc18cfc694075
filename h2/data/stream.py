"""Fixed-length training sequences drawn in a seeded order, sharded by data-parallel rank.

The corpus is cut into non-overlapping windows of seq_len + 1 tokens (inputs and their shifted
targets). Global sequence g of the run is window perm_e[g mod W] where e = g div W is the epoch
and perm_e a permutation seeded by (seed, e). A step consumes `global_batch` consecutive global
sequences; data-parallel rank r of d takes the r-th contiguous block of them. The only state is
`position`, the number of global sequences consumed, so resuming is exact.
"""

from __future__ import annotations

import numpy as np
import torch

from h2.core.errors import UserError
from h2.data.corpus import Corpus


class SequenceStream:

    def __init__(self, corpus: Corpus, seq_len: int, seed: int = 0, position: int = 0):
        if seq_len < 1:
            raise UserError(f"sequence length must be positive, got {seq_len}")
        self.corpus = corpus
        self.seq_len = seq_len
        self.seed = seed
        self.position = position
        self.num_windows = (len(corpus.tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise UserError(f"corpus of {len(corpus.tokens)} tokens is shorter than one sequence of {seq_len + 1}")
        self._epoch, self._permutation = -1, None

    def _window_of(self, global_index: int) -> int:
        epoch, offset = divmod(global_index, self.num_windows)
        if epoch != self._epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            self._epoch, self._permutation = epoch, rng.permutation(self.num_windows)
        return int(self._permutation[offset])

    def sequences(self, first: int, count: int) -> torch.Tensor:
        """Global sequences [first, first + count) as an int64 tensor [count, seq_len + 1]."""
        rows = []
        for g in range(first, first + count):
            start = self._window_of(g) * self.seq_len
            rows.append(self.corpus.tokens[start:start + self.seq_len + 1])
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def next_batch(self, global_batch: int, dp_rank: int = 0, dp_size: int = 1) -> torch.Tensor:
        """This rank's share of the next global batch; advances the position by global_batch."""
        if global_batch % dp_size:
            raise UserError(f"global batch {global_batch} is not divisible by data-parallel size {dp_size}")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        local = global_batch // dp_size
        batch = self.sequences(self.position + dp_rank * local, local)
        self.position += global_batch
        return batch

    def state_dict(self) -> dict:
        return {
            "position": self.position, "seed": self.seed, "seq_len": self.seq_len, "corpus": self.corpus.fingerprint
        }

    def load_state_dict(self, state: dict) -> None:
        mine = {"seed": self.seed, "seq_len": self.seq_len, "corpus": self.corpus.fingerprint}
        for key, value in mine.items():
            if state.get(key) != value:
                raise UserError(f"checkpoint data state: '{key}' is {state.get(key)!r}, this run has {value!r}")
        self.position = int(state["position"])
