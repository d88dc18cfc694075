"""Ministages that do not divide a stage's layers (h2.core.strategy.even_chunks: the larger chunks
first), run on the HeteroPP runtime against the single-device reference trainer (fp32, 20 steps)."""

from __future__ import annotations

import pytest

from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

STEPS = 20
TOLERANCE = 1e-5


@pytest.mark.slow
def test_three_ministages_of_two_one_and_one_layers_match_the_reference():
    data = {
        "dp": 2, "micro_batches": 2, "micro_batch_size": 2, "seq_len": 32, "ministages": 3,
        "optimizer_sharding": "zero2", "model": {"preset": "tiny", "num_layers": 4}, "stages": [{
            "chips": ["chip-a", "chip-b"], "rows": [1, 3], "tp": 1, "layers": 4
        }]
    }
    records, _ = run_pipeline(data, STEPS)
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE
