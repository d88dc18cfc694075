"""Shared helpers of the HeteroAuto tests (a module name of its own, so no clash with tests/conftest.py)."""

import os
import random

from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.model_config import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTERS = os.path.join(ROOT, "configs", "clusters")
STRATEGIES = os.path.join(ROOT, "configs", "strategies")


def small_model(layers: int) -> ModelConfig:
    return ModelConfig(name="small-test", vocab_size=512, hidden_size=256, num_layers=layers, num_heads=4,
                       num_kv_heads=2, intermediate_size=512, max_seq_len=512)


def random_problem(rng: random.Random, max_types: int = 3):
    """A small random cluster, model and training spec, small enough for the exhaustive oracle."""
    model = small_model(rng.randint(2, 9))
    chips = tuple(
        ChipType(name="ABC"[i], count=rng.choice([1, 2, 4, 6, 8]), memory_gb=rng.choice(
            [0.03, 0.06, 0.1, 0.2, 0.4]), chips_per_node=4, tp_max=rng.choice([1, 2, 4]), intra_node_gbps=rng.choice(
                [10.0, 100.0]), inter_node_gbps=rng.choice([1.0, 10.0]), peak_tflops=rng.choice([0.01, 0.05, 0.2]),
                 tp_efficiency_per_doubling=rng.choice([1.0, 0.9]), memory_bandwidth_gbps=100.0)
        for i in range(rng.randint(1, max_types)))
    training = TrainingSpec(seq_len=256, global_batch_sequences=rng.choice([1, 2, 4, 6, 8, 12]),
                            alpha=rng.choice([0.0, 0.5, 1.0]))
    return ClusterSpec(name="random", chips=chips), model, training
