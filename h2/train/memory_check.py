"""Before the first batch: refuse, in one line, a run whose estimated training memory exceeds what its
device has free (host memory for cpu, the device's free memory otherwise), instead of growing until the
host is exhausted or an allocator fails mid-step.

The estimate is a lower bound built from the model's accounting (h2.core.model_config): weights,
gradients and AdamW's two moments in fp32, every layer's kept activations for one micro-batch, and the
logits with their gradient."""

from __future__ import annotations

import torch

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.training import TrainConfig

_GIB = float(1 << 30)


def training_bytes(model_config: ModelConfig, config: TrainConfig) -> int:
    """Lower bound of the memory one single-device training step needs."""
    element = 2 if config.dtype == "bf16" else 4
    seq_len = config.seq_len or model_config.max_seq_len
    weights_grads_adam = 16 * model_config.num_parameters()
    layers = model_config.num_layers * model_config.layer_activation_bytes(
        config.micro_batch_size, seq_len, bytes_per_element=element)
    logits = 2 * 4 * config.micro_batch_size * seq_len * model_config.vocab_size
    return weights_grads_adam + layers + logits


def free_bytes(device: torch.device) -> tuple[int, str] | None:
    """What `device` has free and where that figure comes from; None where it cannot be asked."""
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024, "host memory available (MemAvailable)"
        except OSError:
            return None
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "mem_get_info"):
        return None
    free, _total = backend.mem_get_info(device)
    return int(free), f"free memory of {device}"


def check_training_fits(model_config: ModelConfig, config: TrainConfig, device: torch.device) -> None:
    needed = training_bytes(model_config, config)
    have = free_bytes(device)
    if have is not None and needed > have[0]:
        raise UserError(f"training needs at least {needed / _GIB:.1f} GiB (model '{model_config.name}', "
                        f"{model_config.num_parameters():,} parameters, micro-batch {config.micro_batch_size} x "
                        f"{config.seq_len or model_config.max_seq_len} tokens), more than the "
                        f"{have[0] / _GIB:.1f} GiB {have[1]}: lower --micro-batch-size or --seq-len")
