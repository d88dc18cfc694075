"""One rank's part of a HeteroPP pipeline: its stage built from a strategy, its process groups, and
one optimizer step (the schedule's actions, the DP gradient reduction, the global-norm clip, the
update).

Equivalent, step for step, to the single-device reference trainer on the same data: the global
batch is micro_batches micro-batches of R = dp * micro_batch_size consecutive sequences; replica d
of a stage with dp_s replicas takes sequences [d * R / dp_s, (d + 1) * R / dp_s) of each
(heteropp.topology), the last stage scales each replica's micro-batch loss by
1 / (dp_last * micro_batches), and the loss of a step is the mean token cross-entropy over the batch.

The data, the learning-rate schedule, metrics and the step loop belong to the trainer that drives
this engine (h2.train.pipeline).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import torch
import torch.distributed as dist

from h2.core.devices import resolve_device
from h2.core.errors import UserError
from h2.core.links import RankLinks
from h2.core.stage_orders import run_schedule
from h2.core.training import PipelineOptions, TrainConfig
from h2.model.transformer import Transformer
from heteropp.data_parallel import StageOptimizer, clip_by_global_norm
from heteropp.executor import StageExecutor
from heteropp.groups import build_groups, check_p2p_backend, check_stage_backend, p2p_needs_host_staging
from heteropp.p2p import P2P
from heteropp.resharding import Resharder
from heteropp.stage import apply_recompute, build_stage, model_parameter_name
from heteropp.tensor_parallel import WeightGradStore, apply_tp, check_tp_divides, is_tp_sharded, split_dim
from heteropp.topology import Topology
from heteropp.tracing import SpanRecorder, span


def rank_device(device_type: str, rank: int) -> torch.device:
    """This rank's device: `device_type`, the local rank's index among the devices of that type."""
    device = resolve_device(device_type)
    if device.type == "cpu" or device.index is not None:
        return device
    count = getattr(torch, device.type).device_count()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return torch.device(device.type, local_rank % count)


def train_config_for(strategy, config: TrainConfig) -> TrainConfig:
    """The strategy fixes the batch shape; everything else comes from `config`."""
    model = strategy.model_config()
    seq_len = strategy.seq_len or config.seq_len or model.max_seq_len
    return dataclasses.replace(config, micro_batch_size=strategy.micro_batch_size,
                               micro_batches=strategy.micro_batches, seq_len=seq_len,
                               lr_decay_steps=config.lr_decay_steps or config.steps)


PACING_FIELDS = ("kernels", "late_kernels", "emulated_s", "overrun_s")


@dataclasses.dataclass
class StepResult:
    loss: torch.Tensor          # the step's mean loss (meaningful on the last stage)
    grad_norm: float
    cross_stage_bytes: int      # bytes sent across all stage boundaries in this step, summed over ranks


class PipelineEngine:
    def __init__(self, strategy, config: TrainConfig, options: PipelineOptions | None = None,
                 source: str = "strategy", links: RankLinks | None = None,
                 chip_labels: dict[str, str] | None = None):
        """`links`: this rank's emulated link to every other rank (h2.core.links); its sends across
        stages are paced to them (gloo: in P2P; dicomm: in DiComm's shaping layer). `chip_labels`: how
        outputs name each chip type (e.g. 'emu-slow (emulated: 0.02x a host core, 120 MB)'); the chip's
        name where absent."""
        options = options or PipelineOptions()
        self.chip_labels = dict(chip_labels or {})
        check_p2p_backend(options.p2p_backend)
        self.strategy, self.options = strategy, options
        self.model_config = strategy.model_config()
        if self.model_config.tie_embeddings and len(strategy.stages) > 1:
            raise UserError(f"{source}: model '{self.model_config.name}' ties embeddings, "
                            f"which HeteroPP does not support across stages")
        self.config = train_config_for(strategy, config)
        if self.config.seq_len > self.model_config.max_seq_len:
            raise UserError(f"{source}: seq_len {self.config.seq_len} exceeds the model's max_seq_len "
                            f"{self.model_config.max_seq_len}")
        self.topology = Topology.from_strategy(strategy)
        for stage in self.topology.stages:
            check_tp_divides(self.model_config, stage.tp, f"{source}: field 'stages[{stage.index}].tp'")
        world_size, self.rank = dist.get_world_size(), dist.get_rank()
        if world_size != self.topology.world_size:
            raise UserError(f"{source}: needs {self.topology.world_size} processes "
                            f"(sum of tp * dp over stages), the launch has {world_size}")
        self.micro_batch_sequences = self.topology.micro_batch_sequences
        self.place = self.topology.place(self.rank)
        self.stage_info = self.topology.stages[self.place.stage]
        device_type = self.config.device
        self.device = rank_device(self.stage_info.device or device_type, self.rank)
        for stage in self.topology.stages:
            stage_device_type = self.topology.device_type(stage.index, device_type)
            resolve_device(stage_device_type)  # every rank knows every stage's device type (and its backend)
            check_stage_backend(options.stage_backend, stage_device_type)
        self.groups = build_groups(self.topology, self.rank, device_type=device_type,
                                   p2p_backend=options.p2p_backend, stage_backend=options.stage_backend,
                                   links=links)
        self.is_last = self.place.stage == self.topology.num_stages - 1

        torch.manual_seed(self.config.seed)
        model = Transformer(self.model_config)
        # The global gradient norm is taken as torch's clip_grad_norm_ takes it on the whole model:
        # the norm of every parameter's gradient norm, in the model's parameter order.
        self.norm_slot = {name: slot for slot, (name, _) in enumerate(model.named_parameters())}
        self.actions = run_schedule(strategy, options.schedule, source)[self.place.stage]
        splits_backward = any(action.kind == "W" for action in self.actions)
        self.store = WeightGradStore() if splits_backward else None
        stage = build_stage(model, self.stage_info.layers, first=self.place.stage == 0, last=self.is_last)
        stage = apply_tp(stage, tp_index=self.place.tp_index, tp_size=self.stage_info.tp, group=self.groups.tp,
                         store=self.store)
        self.recorder = (SpanRecorder(self.rank, f"stage {self.place.stage}, {self.chip_label}", self.device)
                         if options.trace else None)
        if self.stage_info.recompute:
            stage = apply_recompute(stage, self.recorder)
        with self.on_chip():
            self.stage = stage.to(self.device)
        del model

        # Parameters go by their names in the whole model, which a checkpoint's shards share.
        named = [(model_parameter_name(name, self.stage_info.layers), param) for name, param in stage.named_parameters()]
        self.optimizer = StageOptimizer(named, lr=self.config.lr, betas=(self.config.beta1, self.config.beta2),
                                        weight_decay=self.config.weight_decay, dp_group=self.groups.dp,
                                        dp_rank=self.place.dp_index, dp_size=self.stage_info.dp,
                                        sharding=options.optimizer_sharding)
        # Each gradient element enters the global norm once: on DP replica 0, and for parameters
        # replicated over TP (norm weights) on TP index 0 only.
        self.counted_in_norm = [self.place.dp_index == 0 and (is_tp_sharded(name) or self.place.tp_index == 0)
                                for name, _ in named]
        self.counted_slots = torch.tensor([self.norm_slot[name] for (name, _), counted in zip(named, self.counted_in_norm)
                                           if counted], dtype=torch.long)
        self.p2p = P2P(stage_through_host=p2p_needs_host_staging(options.p2p_backend, self.device.type),
                       link_to=links.to if links is not None and options.p2p_backend == "gloo" else None)
        self.resharder = Resharder(self.topology, self.rank, self.groups, self.p2p, mode=options.resharding)
        activation_shape = (self.stage_info.micro_batch_size, self.config.seq_len, self.model_config.hidden_size)
        self.executor = StageExecutor(self.stage, stage_index=self.place.stage, num_stages=self.topology.num_stages,
                                      resharder=self.resharder, store=self.store, activation_shape=activation_shape,
                                      prefetch=options.prefetch, device=self.device, recorder=self.recorder,
                                      autocast=torch.bfloat16 if self.config.dtype == "bf16" else None)

    def parameter_pieces(self) -> list[tuple[str, torch.nn.Parameter, int | None]]:
        """(name in the whole model, this rank's tensor, the dimension along which TP cuts it or None
        where this rank holds it whole) for every parameter of the rank's stage."""
        tp = self.stage_info.tp
        return [(name, param, split_dim(name) if tp > 1 else None)
                for name, param in zip(self.optimizer.names, self.optimizer.params)]

    def barrier(self) -> None:
        """Return once every rank has called this (one all-reduce of a host scalar over all ranks)."""
        dist.all_reduce(torch.zeros(1), group=self.groups.everyone)

    @property
    def chip_label(self) -> str:
        return self.chip_labels.get(self.stage_info.chip, self.stage_info.chip)

    @contextlib.contextmanager
    def on_chip(self):
        """Work on this rank's chip: running out of its memory raises torch.OutOfMemoryError naming the
        stage and the chip, as the first line of the device's own message."""
        try:
            yield
        except torch.OutOfMemoryError as error:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
            raise torch.OutOfMemoryError(f"stage {self.place.stage}, chip {self.chip_label}, rank {self.rank} on "
                                         f"{self.device}: {detail}") from None

    def device_report(self, host_cpu_s: float = 0.0) -> list[dict]:
        """Per stage, over its ranks (every rank must call this): the largest peak of device memory
        allocated by tensors (None on devices without memory statistics), and, on an emulating
        device, the kernels it paced, their emulated seconds, and how many were late (overrun_s: by
        how much in all; a late kernel's time depended on the host's load); and the host CPU seconds
        its ranks spent (`host_cpu_s`, what each rank passes: the host work the stage needed)."""
        module = getattr(torch, self.device.type, None)
        peak = module.max_memory_allocated(self.device) if hasattr(module, "max_memory_allocated") else -1
        pacing = getattr(module, "pacing_stats", lambda: None)() or {}
        stages = self.topology.num_stages
        peaks = torch.full((stages,), -1.0, dtype=torch.float64)
        peaks[self.place.stage] = float(peak)
        sums = torch.zeros((stages, len(PACING_FIELDS) + 1), dtype=torch.float64)
        sums[self.place.stage] = torch.tensor([float(pacing.get(key, 0.0)) for key in PACING_FIELDS] + [host_cpu_s],
                                              dtype=torch.float64)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX, group=self.groups.everyone)
        dist.all_reduce(sums, group=self.groups.everyone)
        report = []
        for stage in self.topology.stages:
            row = {"stage": stage.index, "chip": stage.chip,
                   "peak_allocated_bytes": None if peaks[stage.index] < 0 else int(peaks[stage.index])}
            row.update({key: (int(value) if key.endswith("kernels") else float(value))
                        for key, value in zip(PACING_FIELDS, sums[stage.index].tolist())})
            row["host_cpu_s"] = float(sums[stage.index, -1])
            report.append(row)
        return report

    def write_trace(self) -> str | None:
        """This rank's spans so far to OPTIONS.trace/rank-<r>.json (a traced run); the file."""
        if self.recorder is None:
            return None
        path = os.path.join(self.options.trace, f"rank-{self.rank}.json")
        self.recorder.write(path)
        return path

    @property
    def global_batch(self) -> int:
        return self.micro_batch_sequences * self.config.micro_batches

    @property
    def reports_loss(self) -> bool:
        """Whether this rank holds the step's loss and writes the run's metrics: the first rank of
        the last stage."""
        return self.is_last and self.place.dp_index == 0 and self.place.tp_index == 0

    def replica_micro_batches(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """This replica's sequences of each micro-batch of the global `batch`."""
        rows = self.stage_info.rows(self.place.dp_index)
        starts = range(0, self.global_batch, self.micro_batch_sequences)
        return [batch[start + rows.start:start + rows.stop] for start in starts]

    def step(self, batch: torch.Tensor, lr: float) -> StepResult:
        """One optimizer step on the global `batch` (sequences of seq_len + 1 tokens) at learning rate `lr`."""
        with self.on_chip():
            return self._step(batch, lr)

    def _step(self, batch: torch.Tensor, lr: float) -> StepResult:
        micro_batches = self.replica_micro_batches(batch)
        inputs = [mb[:, :-1].to(self.device) for mb in micro_batches]
        targets = [mb[:, 1:].to(self.device) for mb in micro_batches]
        bytes_before = self.p2p.bytes_sent
        last_stage_dp = self.topology.stages[-1].dp
        if self.recorder is not None:
            self.recorder.step += 1
        loss_sum = self.executor.run(self.actions, inputs, targets, 1.0 / (last_stage_dp * self.config.micro_batches))
        with span(self.recorder if self.stage_info.dp > 1 else None, "gradients over dp", "all-reduce",
                  ranks=self.stage_info.dp):
            self.optimizer.reduce_gradients()
        # One all-reduce over every rank: each model parameter's squared gradient norm (summed over
        # its TP pieces, exact in float64 for a whole tensor) and the bytes sent across stages.
        with span(self.recorder, "gradient norm", "all-reduce", ranks=self.topology.world_size):
            totals = torch.zeros(len(self.norm_slot) + 1, dtype=torch.float64)
            norms = self.optimizer.grad_norms(self.counted_in_norm)
            if norms:
                totals.index_add_(0, self.counted_slots, torch.stack(norms).double().cpu().square())
            totals[-1] = float(self.p2p.bytes_sent - bytes_before)
            dist.all_reduce(totals, group=self.groups.everyone)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        with span(self.recorder, "clip and update", "optimizer"):
            global_norm = torch.linalg.vector_norm(totals[:-1].sqrt().float())
            grad_norm = clip_by_global_norm(global_norm, self.optimizer.params, max_norm)
            self.optimizer.step(lr)
            self.optimizer.zero_grad()
        if self.is_last and self.groups.dp is not None:
            with span(self.recorder, "loss over dp", "all-reduce", ranks=self.stage_info.dp):
                dist.all_reduce(loss_sum, group=self.groups.dp)
        return StepResult(loss=loss_sum, grad_norm=grad_norm, cross_stage_bytes=int(totals[-1]))
