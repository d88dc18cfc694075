"""Before the first batch: refuse, in one line, a run whose estimated training memory exceeds what its
device has free (host memory for cpu, the device's free memory otherwise), instead of growing until the
host is exhausted or an allocator fails mid-step.

The estimate is a lower bound built from the model's accounting (h2.core.model_config): weights,
gradients and AdamW's two moments in fp32, every layer's kept activations for one micro-batch, and the
logits with their gradient. A pipeline rank's estimate (`pipeline_rank_bytes`) counts its stage's share
of the terms that coexist from its second step on; `h2 train --strategy` checks every rank before
launching, and each rank checks its own device again before it builds its stage."""

from __future__ import annotations

import torch

from h2.core.cluster import ClusterSpec
from h2.core.devices import resolve_device
from h2.core.emulation import describe_chip
from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.core.training import TrainConfig
from heteropp.topology import Topology

_GIB = float(1 << 30)


def training_bytes(model_config: ModelConfig, config: TrainConfig) -> int:
    """Lower bound of the memory one single-device training step needs."""
    element = 2 if config.dtype == "bf16" else 4
    seq_len = config.seq_len or model_config.max_seq_len
    weights_grads_adam = 16 * model_config.num_parameters()
    layers = model_config.num_layers * model_config.layer_activation_bytes(config.micro_batch_size, seq_len,
                                                                           bytes_per_element=element)
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


def pipeline_rank_bytes(model_config: ModelConfig, config: TrainConfig, topology: Topology, rank: int) -> int:
    """Lower bound of the memory `rank` of a pipeline needs at once, from its second step on: its shard
    of the stage's weights in fp32 and AdamW's two moments (divided over the stage's dp replicas, as
    ZeRO at most divides them), plus the larger of its gradients and one micro-batch's kept activations
    of its layers with, on the last stage, that micro-batch's fp32 logits (the gradients fill as
    backward frees the activations). `config`: the run's config with the strategy's batch shape
    (heteropp.engine.train_config_for)."""
    place = topology.place(rank)
    stage = topology.stages[place.stage]
    first, last = place.stage == 0, place.stage == topology.num_stages - 1
    params = len(stage.layers) * model_config.layer_params()
    params += model_config.embedding_params() if first else 0
    params += model_config.head_params() + model_config.final_norm_params() if last else 0
    params /= stage.tp
    rows = len(stage.rows(place.dp_index))
    element = 2 if config.dtype == "bf16" else 4
    if stage.recompute:
        kept = model_config.layer_recompute_activation_bytes(rows, config.seq_len, bytes_per_element=element)
    else:
        kept = model_config.layer_activation_bytes(rows, config.seq_len, bytes_per_element=element, tp=stage.tp)
    logits = 4 * rows * config.seq_len * model_config.vocab_size / stage.tp if last else 0
    gradients = 4 * params / stage.dp
    return int(params * (4 + 8 / stage.dp) + max(gradients, len(stage.layers) * kept + logits))


def check_pipeline_rank_fits(model_config: ModelConfig, config: TrainConfig, topology: Topology, rank: int, chip: str,
                             available: tuple[int, str] | None) -> None:
    """Refuses, in one line naming the rank, its stage and chip, a rank whose lower bound exceeds
    `available` (bytes, and where that figure comes from; None: unknown, not checked)."""
    needed = pipeline_rank_bytes(model_config, config, topology, rank)
    if available is None or needed <= available[0]:
        return
    place = topology.place(rank)
    rows = len(topology.stages[place.stage].rows(place.dp_index))
    raise UserError(f"rank {rank} (stage {place.stage}, chip {chip}) needs at least {_size(needed)} (its share "
                    f"of model '{model_config.name}' and one micro-batch of {rows} x {config.seq_len} tokens), more "
                    f"than the {_size(available[0])} {available[1]}: lower the strategy's micro_batch_size "
                    f"or give stage {place.stage} fewer layers")


def _size(count: float) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.2f} MB"


def _device_holds_its_stage(strategy) -> bool:
    """Whether a rank keeps its whole stage on its device: not so with Zorse's ministages or offload
    to host memory, which this estimate does not model (those strategies are not checked)."""
    return strategy.ministages == 1 and not strategy.offload


def _rank_chip(topology: Topology, rank: int) -> str:
    place = topology.place(rank)
    return topology.stages[place.stage].replica_chip(place.dp_index)


def check_pipeline_fits(strategy, config: TrainConfig, cluster: ClusterSpec | None = None) -> None:
    """`h2 train --strategy`'s check before it launches: every rank's lower bound against its emulated
    chip's memory (a cluster chip with `emulation:`) or, for a rank on cpu, the host memory available.
    Ranks on other devices are checked by the rank itself (`check_rank_fits`)."""
    from heteropp.engine import train_config_for

    model_config, config = strategy.model_config(), train_config_for(strategy, config)
    if config.seq_len > model_config.max_seq_len or not _device_holds_its_stage(strategy):
        return  # the engine refuses the first with its own line
    topology = Topology.from_strategy(strategy)
    host = free_bytes(torch.device("cpu"))
    in_host_memory = []  # ranks on cpu or on an emulated chip, whose memory is this host's
    for rank in range(topology.world_size):
        name = _rank_chip(topology, rank)
        chip = cluster.chip(name) if cluster is not None else None
        if chip is not None and chip.emulation is not None:
            available, label = (int(chip.memory_gb * 1e9), "emulated memory of the chip"), describe_chip(chip)
        elif resolve_device(topology.device_type(topology.place(rank).stage, config.device)).type == "cpu":
            available, label = host, name
        else:
            continue
        check_pipeline_rank_fits(model_config, config, topology, rank, label, available)
        in_host_memory.append(rank)
    _check_host_holds_ranks(model_config, config, topology, in_host_memory, host)


def _check_host_holds_ranks(model_config: ModelConfig, config: TrainConfig, topology: Topology, ranks: list[int],
                            host: tuple[int, str] | None) -> None:
    """Ranks that each fit can still not fit together: their memory is one host's."""
    needed = sum(pipeline_rank_bytes(model_config, config, topology, rank) for rank in ranks)
    if host is None or len(ranks) < 2 or needed <= host[0]:
        return
    raise UserError(f"the {len(ranks)} ranks whose memory is this host's (cpu ranks and emulated chips) need at "
                    f"least {_size(needed)} together, more than the {_size(host[0])} {host[1]}: lower the "
                    f"strategy's micro_batch_size or run fewer ranks on this host")


def check_rank_fits(strategy, config: TrainConfig, rank: int, chip_labels: dict[str, str] | None = None) -> None:
    """A pipeline rank's own check before it builds its stage: its lower bound against what its device
    has free."""
    from heteropp.engine import rank_device, train_config_for

    model_config, config = strategy.model_config(), train_config_for(strategy, config)
    topology = Topology.from_strategy(strategy)
    if config.seq_len > model_config.max_seq_len or not 0 <= rank < topology.world_size:
        return  # the engine refuses these with their own lines
    if not _device_holds_its_stage(strategy):
        return
    device = rank_device(topology.stages[topology.place(rank).stage].device or config.device, rank)
    name = _rank_chip(topology, rank)
    check_pipeline_rank_fits(model_config, config, topology, rank, (chip_labels or {}).get(name, name),
                             free_bytes(device))
