"""One rank's part of a HeteroPP pipeline: its stage built from a strategy, its process groups, and
one optimizer step (the schedule's actions, the DP gradient reduction, the global-norm clip, the
update).

Equivalent, step for step, to the single-device reference trainer on the same data: the global
batch is micro_batches micro-batches of R = dp * micro_batch_size consecutive sequences; replica d
of a stage with dp_s replicas takes sequences [d * R / dp_s, (d + 1) * R / dp_s) of each
(heteropp.topology; uneven `rows` of a Zorse group likewise), the last stage scales each replica's
micro-batch loss by its rows / (R * micro_batches), and the loss of a step is the mean token
cross-entropy over the batch.

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
from h2.core.links import PeerLinks
from h2.core.schedule import resolve_schedule
from h2.core.stage_orders import parse_send_lists, run_schedule
from h2.core.training import PipelineOptions, TrainConfig
from h2.model.hf_weights import copy_into, load_hf_parameters
from h2.model.transformer import Transformer
from heteropp.data_parallel import StageOptimizer, clip_coefficient
from heteropp.executor import StageExecutor
from heteropp.groups import build_groups, dicomm_registered, p2p_needs_host_staging
from heteropp.ministages import MinistageExecutor
from heteropp.p2p import BACKWARD, FORWARD, P2P, SharedLink
from heteropp.resharding import Resharder
from heteropp.reshuffle import ReshuffleExecutor, job_store
from heteropp.stage import apply_recompute, build_stage
from heteropp.stage_parameters import StageParameter, stage_parameters
from heteropp.tensor_parallel import WeightGradStore, apply_tp
from heteropp.tied_embeddings import EMBEDDING, HEAD, sum_tied_gradient, tied_group
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
    return dataclasses.replace(config, micro_batch_size=strategy.micro_batch_size, micro_batches=strategy.micro_batches,
                               seq_len=seq_len, lr_decay_steps=config.lr_decay_steps or config.steps)


PACING_FIELDS = ("kernels", "late_kernels", "emulated_s", "overrun_s")
VENDOR_NAME_BYTES = 32  # the longest vendor name a stage report carries
FORWARD_KINDS = ("F", "SEND_F", "RECV_F")  # what an evaluation runs of a step's actions


@dataclasses.dataclass
class StepResult:
    loss: torch.Tensor  # the step's mean loss (meaningful on the last stage)
    grad_norm: float
    cross_stage_bytes: int  # bytes sent across all stage boundaries in this step, summed over ranks


class PipelineEngine:

    def __init__(self, strategy, config: TrainConfig, options: PipelineOptions | None = None, source: str = "strategy",
                 links: PeerLinks | None = None, chip_labels: dict[str, str] | None = None):
        """`links`: this rank's emulated link to every other rank (h2.core.links); its sends across
        stages are paced to them (gloo: in P2P; dicomm: in DiComm's shaping layer). `chip_labels`: how
        outputs name each chip type (e.g. 'emu-slow (emulated: 0.02x a host core, 120 MB)'); the chip's
        name where absent. The job was checked before any rank started (heteropp.job_checks); what it
        checked is asserted here."""
        self.strategy, self.options, self.source = strategy, options or PipelineOptions(), source
        self.chip_labels = dict(chip_labels or {})
        self.model_config = strategy.model_config()
        self.config = train_config_for(strategy, config)
        self.schedule = resolve_schedule(strategy, self.options.schedule, source)
        self.reshuffled = bool(strategy.reshuffle)  # heteropp.reshuffle: whole micro-batches, GPipe order
        self.ministage_group = self.schedule.ministage_executor and not self.reshuffled
        self._check_invariants()
        self._place_rank_and_build_groups(links)
        self.actions = run_schedule(strategy, self.options.schedule, source, self.place.dp_index)[self.place.stage]
        self.recorder = (SpanRecorder(self.rank, f"stage {self.place.stage}, {self.chip_label}", self.device)
                         if self.options.trace else None)
        chunk_layers = (strategy.chunk_layers(self.place.stage) if self.ministage_group else [self.stage_info.layers])
        chunks = self._build_chunks(chunk_layers)
        self.stage = torch.nn.ModuleList(chunks) if self.ministage_group else chunks[0]
        self._set_up_optimizer(chunks, chunk_layers)
        self._connect_stages(links)
        self.executor = self._executor_for_schedule(chunks)

    def _check_invariants(self) -> None:
        """What heteropp.job_checks.check_pipeline_job refused before the ranks started."""
        model = self.model_config
        assert self.config.seq_len <= model.max_seq_len, "seq_len beyond the model's max_seq_len"

    def _place_rank_and_build_groups(self, links: PeerLinks | None) -> None:
        """Topology and groups: this rank's place and device, every stage's device type known here (and
        its backend loaded), and the process groups (wrapping around for ministages)."""
        self.topology = Topology.from_strategy(self.strategy)
        self.rank = dist.get_rank()
        assert dist.get_world_size() == self.topology.world_size, "the launch's processes are the strategy's ranks"
        self.micro_batch_sequences = self.topology.micro_batch_sequences
        self.place = self.topology.place(self.rank)
        self.stage_info = self.topology.stages[self.place.stage]
        self.is_last = self.place.stage == self.topology.num_stages - 1
        device_type = self.config.device
        self.device = rank_device(self.stage_info.device or device_type, self.rank)
        self._load_backends()
        self.groups = build_groups(self.topology, self.rank, device_type=device_type,
                                   p2p_backend=self.options.p2p_backend, stage_backend=self.options.stage_backend,
                                   links=links, wrap_around=self.ministage_group)
        across = self.model_config.tie_embeddings and self.topology.num_stages > 1
        self.tied_group = tied_group(self.topology, self.rank, self.options.p2p_backend, links) if across else None

    def _load_backends(self) -> None:
        """Every stage's device type (and its collective backend) and DiComm's torch.distributed backend
        where the options name it, loaded in this process before any group is built."""
        for stage in self.topology.stages:
            resolve_device(self.topology.device_type(stage.index, self.config.device))
        if "dicomm" in (self.options.p2p_backend, self.options.stage_backend):
            registered = dicomm_registered()  # imports DiComm, which registers its backend
            assert registered, "DiComm's backend is registered (the launcher checked the build)"

    def _build_chunks(self, chunk_layers: list[range]) -> list[torch.nn.Module]:
        """Build chunks: this rank's layer chunks of the whole (seeded) model, each cut to its stage, split
        by TP and wrapped in recompute where the stage asks, on the rank's chip. Notes the whole model's
        parameter order for the global norm (`norm_slot`) and the weight-gradient store a split backward
        needs (`store`)."""
        torch.manual_seed(self.config.seed)
        model = Transformer(self.model_config)
        if self.config.init_from:  # checked by heteropp.job_checks; a resumed run's checkpoint then wins
            copy_into(model, load_hf_parameters(self.model_config, self.config.init_from))
        # The global gradient norm is taken as torch's clip_grad_norm_ takes it on the whole model:
        # the norm of every parameter's gradient norm, in the model's parameter order.
        self.norm_slot = {name: slot for slot, (name, _) in enumerate(model.named_parameters())}
        self.store = WeightGradStore() if any(action.kind == "W" for action in self.actions) else None
        chunks = []
        for index, layers in enumerate(chunk_layers):
            chunk = build_stage(model, layers, first=self.place.stage == 0 and index == 0, last=self.is_last
                                and index == len(chunk_layers) - 1)
            chunk = apply_tp(chunk, tp_index=self.place.tp_index, tp_size=self.stage_info.tp, group=self.groups.tp,
                             store=self.store)
            if self.stage_info.recompute:
                chunk = apply_recompute(chunk, self.recorder)
            with self.on_chip():
                chunks.append(chunk.to(self.device))
        return chunks

    def _set_up_optimizer(self, chunks: list[torch.nn.Module], chunk_layers: list[range]) -> None:
        """Optimizer and norm accounting: the stage's optimizer over its parameters by their names in the
        whole model (which a checkpoint's shards share), each chunk's parameter indices, and which
        gradient elements this rank counts in the global norm."""
        self.pieces, self.chunk_params = [], []
        for chunk, layers in zip(chunks, chunk_layers):
            first = len(self.pieces)
            self.pieces += stage_parameters(chunk, layers)
            self.chunk_params.append(list(range(first, len(self.pieces))))
        named = [(name, param) for name, param, _ in self.pieces]
        self.sharding = self.strategy.optimizer_sharding or self.options.optimizer_sharding
        self.optimizer = StageOptimizer(named, lr=self.config.lr, betas=(self.config.beta1, self.config.beta2),
                                        weight_decay=self.config.weight_decay, dp_group=self.groups.dp,
                                        dp_rank=self.place.dp_index, dp_size=self.stage_info.dp, sharding=self.sharding)
        # Each gradient element enters the global norm once: on the replica that counts it (replica 0,
        # or under ZeRO-2 every replica, for its shard), and for parameters replicated over TP (norm
        # weights) on TP index 0 only.
        self.counted_in_norm = [
            self.optimizer.holds_reduced_gradient(index) and (split_dim is not None or self.place.tp_index == 0)
            for index, (_, _, split_dim) in enumerate(self.pieces)
        ]
        tied_across = self.tied_group is not None
        self.param_slots = [self.norm_slot[EMBEDDING if name == HEAD and tied_across else name] for name, _ in named]
        # A head tied to the first stage's embedding: its gradient joins the embedding's, counted there.
        self.tied_index = next((i for i, (name, _) in enumerate(named) if name in (EMBEDDING, HEAD)), None)
        if tied_across and self.is_last:
            self.counted_in_norm[self.tied_index] = False

    def _connect_stages(self, links: PeerLinks | None) -> None:
        """The point-to-point path to the neighbouring stages (paced to `links` under gloo) and the
        resharder that moves activations and gradients over it."""
        paced = links is not None and self.options.p2p_backend == "gloo"
        self.p2p = P2P(stage_through_host=p2p_needs_host_staging(self.options.p2p_backend, self.device.type),
                       link_to=links.to if paced else None, shared=self._shared_links(links) if paced else None)
        self.resharder = Resharder(self.topology, self.rank, self.groups, self.p2p, mode=self.options.resharding)

    def _shared_links(self, links: PeerLinks) -> dict[int, SharedLink]:
        """Per direction, the cross-site link this rank's sends share with the other replicas' in the
        order of the strategy's send lists (jeeves with replicas, heteroauto.jeeves_plan); only between
        stages of one rank per replica (TP 1) on both sides."""
        if self.strategy.send_lists is None:
            return {}
        stage, stages = self.place.stage, self.topology.stages
        lists = parse_send_lists(self.strategy.send_lists, len(stages), self.stage_info.dp, self.strategy.micro_batches,
                                 self.source)
        shared = {}
        for direction, boundary, peer_stage in ((FORWARD, stage, stage + 1), (BACKWARD, stage - 1, stage - 1)):
            order = lists.get((boundary, "F" if direction == FORWARD else "B"))
            if order is None or stages[stage].tp != 1 or stages[peer_stage].tp != 1:
                continue
            peer = stages[peer_stage].rank_of(self.place.dp_index, 0)
            shared[direction] = SharedLink(link=links.link_to(peer), order=order, replica=self.place.dp_index,
                                           store=dist.distributed_c10d._get_default_store(),
                                           key=f"h2/shared-link/{boundary}{'FB'[direction]}",
                                           kernel_shaped=links.shaped_by_kernel(peer))
        return shared

    def _executor_for_schedule(self,
                               chunks: list[torch.nn.Module]) -> StageExecutor | MinistageExecutor | ReshuffleExecutor:
        """The executor that runs this schedule's actions (the registry's `ministage_executor` flag;
        the strategy's `reshuffle`: GPipe order on whole micro-batches, heteropp.reshuffle)."""
        activation_shape = (len(self.stage_info.rows(self.place.dp_index)), self.config.seq_len,
                            self.model_config.hidden_size)
        autocast = torch.bfloat16 if self.config.dtype == "bf16" else None
        if self.reshuffled:
            whole = (self.micro_batch_sequences, ) + activation_shape[1:]
            return ReshuffleExecutor(chunks[0], topology=self.topology, place=self.place, groups=self.groups,
                                     p2p=self.p2p, store=job_store(), activation_shape=whole,
                                     micro_batches=self.config.micro_batches, device=self.device, autocast=autocast,
                                     by_finish_order=self.options.reshuffle_by_finish)
        if self.ministage_group:
            return MinistageExecutor(chunks, device=self.device, offload=tuple(
                self.strategy.offload), autocast=autocast, stage_index=self.place.stage,
                                     num_stages=self.topology.num_stages, resharder=self.resharder,
                                     activation_shape=activation_shape, prefetch=self.options.offload_prefetch)
        return StageExecutor(chunks[0], stage_index=self.place.stage, num_stages=self.topology.num_stages,
                             resharder=self.resharder, store=self.store, activation_shape=activation_shape,
                             prefetch=self.options.prefetch, device=self.device, recorder=self.recorder,
                             autocast=autocast)

    def release(self) -> None:
        """After the last step: offloaded parameters that stayed on the device between steps (the
        ministages' prefetch keeps two chunks resident) back to host memory."""
        if self.ministage_group:
            self.executor.release()

    def parameter_pieces(self) -> list[StageParameter]:
        """(name in the whole model, this rank's tensor, the dimension along which TP cut it or None
        where this rank holds it whole) for every parameter of the rank's stage."""
        return list(self.pieces)

    def barrier(self) -> None:
        """Return once every rank has called this (one all-reduce of a host scalar over all ranks)."""
        dist.all_reduce(torch.zeros(1), group=self.groups.everyone)

    @property
    def chip_label(self) -> str:
        chip = self.stage_info.replica_chip(self.place.dp_index)
        return self.chip_labels.get(chip, chip)

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
        its ranks spent (`host_cpu_s`, what each rank passes: the host work the stage needed); the DIPU
        vendor its ranks loaded (None off the dipu device)."""
        module = getattr(torch, self.device.type, None)
        peak = module.max_memory_allocated(self.device) if hasattr(module, "max_memory_allocated") else -1
        pacing = getattr(module, "pacing_stats", lambda: None)() or {}
        stages = self.topology.num_stages
        peaks = torch.full((stages, ), -1.0, dtype=torch.float64)
        peaks[self.place.stage] = float(peak)
        sums = torch.zeros((stages, len(PACING_FIELDS) + 1), dtype=torch.float64)
        sums[self.place.stage] = torch.tensor([float(pacing.get(key, 0.0))
                                               for key in PACING_FIELDS] + [host_cpu_s], dtype=torch.float64)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX, group=self.groups.everyone)
        dist.all_reduce(sums, group=self.groups.everyone)
        vendors = self._stage_vendors()
        report = []
        for stage in self.topology.stages:
            row = {
                "stage": stage.index, "chip": "+".join(dict.fromkeys(stage.replica_chips or (stage.chip, ))),
                "peak_allocated_bytes": None if peaks[stage.index] < 0 else int(peaks[stage.index])
            }
            row.update({
                key: (int(value) if key.endswith("kernels") else float(value))
                for key, value in zip(PACING_FIELDS, sums[stage.index].tolist())
            })
            row["host_cpu_s"] = float(sums[stage.index, -1])
            row["vendor"] = vendors.get(stage.index)
            report.append(row)
        return report

    def _stage_vendors(self) -> dict[int, str | None]:
        """Per stage, the DIPU vendor(s) its ranks loaded ("+"-joined; None off the dipu device), from every
        rank: one row per rank (its stage, then its vendor's name as bytes) summed over the group."""
        world = dist.get_world_size(self.groups.everyone)
        rows = torch.zeros((world, 1 + VENDOR_NAME_BYTES), dtype=torch.float64)
        name = (self._device_vendor() or "").encode()[:VENDOR_NAME_BYTES]
        rows[dist.get_rank(self.groups.everyone), 0] = float(self.place.stage)
        rows[dist.get_rank(self.groups.everyone), 1:1 + len(name)] = torch.tensor(list(name), dtype=torch.float64)
        dist.all_reduce(rows, group=self.groups.everyone)
        vendors: dict[int, list[str]] = {}
        for row in rows.tolist():
            text = bytes(int(value) for value in row[1:] if value).decode()
            if text and text not in vendors.setdefault(int(row[0]), []):
                vendors[int(row[0])].append(text)
        return {stage: "+".join(names) or None for stage, names in vendors.items()}

    def _device_vendor(self) -> str | None:
        if self.device.type != "dipu":
            return None
        from ditorch.dipu.vendor import vendor_name

        return vendor_name()

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
        """This replica's sequences of each micro-batch of the global `batch` (reshuffled: every
        micro-batch whole, the executor picks this replica's)."""
        rows = self.stage_info.rows(self.place.dp_index)
        if self.reshuffled:
            rows = range(self.micro_batch_sequences)
        starts = range(0, self.global_batch, self.micro_batch_sequences)
        return [batch[start + rows.start:start + rows.stop] for start in starts]

    def _add_squared_norms(self, totals: torch.Tensor, indices) -> None:
        """Add the squared norms of the gradients of parameters `indices` this rank counts to `totals`."""
        counted = [index for index in indices if self.counted_in_norm[index]]
        norms = self.optimizer.grad_norms(self.counted_in_norm, counted)
        if norms:
            slots = torch.tensor([self.param_slots[index] for index in counted], dtype=torch.long)
            totals.index_add_(0, slots, torch.stack(norms).double().cpu().square())

    def _run_ministages(self, inputs, targets, lr: float, totals: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The ministage schedule. At each chunk's STEP its gradients are reduced over the group (to
        their owners under ZeRO-2) and their norms noted; without clipping the chunk's optimizer step
        runs there and then. With clipping (the reference trainer's global-norm clip) the step needs
        the norm over every chunk, known only after the last backward: the reduced gradients (1/dp of
        them under ZeRO-2) wait, set aside, and `_deferred_ministage_steps` clips and steps them.
        With `grad_clip_scope: ministage` each chunk is clipped by its own gradients' norm and steps
        at once. Returns the loss and whether the chunks stepped already."""
        per_ministage = self.config.grad_clip > 0 and self.config.grad_clip_scope == "ministage"
        immediate = not self.config.grad_clip > 0 or per_ministage
        self.waiting_grads: dict[int, list] = {}

        def on_step(chunk: int) -> bool:
            indices = self.chunk_params[chunk]
            self.optimizer.reduce_gradients(indices)
            self._add_squared_norms(totals, indices)
            if per_ministage:
                self.optimizer.scale_gradients(clip_coefficient(self._ministage_norm(indices), self.config.grad_clip),
                                               indices)
            if immediate:
                self.optimizer.step(lr, indices)
                self.optimizer.zero_grad(indices)
            else:
                self.waiting_grads[chunk] = self.optimizer.reduced_gradients(indices)
                self.optimizer.zero_grad(indices)
            return immediate  # whether the chunk's parameters changed

        loss = self.executor.run(self.actions, inputs, targets, self.loss_weight, on_step)
        return loss, immediate

    def _ministage_norm(self, indices: list[int]) -> torch.Tensor:
        """The norm of the gradients of one ministage (parameters `indices` on every rank of this
        stage): each rank's counted squares summed over its TP and DP groups."""
        counted = [index for index in indices if self.counted_in_norm[index]]
        norms = self.optimizer.grad_norms(self.counted_in_norm, counted)
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for norm in norms:
            squares += norm.double().square()
        for group in (self.groups.tp, self.groups.dp):
            if group is not None:
                dist.all_reduce(squares, group=group)
        return squares.cpu().sqrt().float()

    def _deferred_ministage_steps(self, global_norm: torch.Tensor, max_norm: float, lr: float) -> float:
        """Clip the gradients that waited by the global norm, then step each chunk with its
        parameters on the device."""
        coefficient = clip_coefficient(global_norm, max_norm)
        for chunk in self.executor.each_resident(list(range(len(self.chunk_params)))):
            indices = self.chunk_params[chunk]
            self.optimizer.put_gradients(indices, self.waiting_grads.pop(chunk))
            self.optimizer.scale_gradients(coefficient, indices)
            self.optimizer.step(lr, indices)
            self.optimizer.zero_grad(indices)
        return float(global_norm)

    @property
    def loss_weight(self) -> float:
        """What the last stage multiplies a replica's mean micro-batch loss by: its share of the
        global batch's sequences (rows / (R * micro_batches)), so that the sum over replicas and
        micro-batches is the batch's mean loss, with uneven rows too."""
        if self.reshuffled:  # a replica's micro-batches are whole
            return 1.0 / self.config.micro_batches
        rows = len(self.stage_info.rows(self.place.dp_index))
        return rows / (self.micro_batch_sequences * self.config.micro_batches)

    def evaluate(self, batch: torch.Tensor) -> torch.Tensor:
        """The mean loss over the global `batch`, forward only: the step's forwards and the sends and
        receives of activations, in the schedule's order, without gradients or an optimizer step. Every
        rank calls it; the value is meaningful on the last stage."""
        forward_only = [action for action in self.actions if action.kind in FORWARD_KINDS]
        micro_batches = self.replica_micro_batches(batch)
        with self.on_chip(), torch.no_grad():
            inputs = [mb[:, :-1].to(self.device) for mb in micro_batches]
            targets = [mb[:, 1:].to(self.device) for mb in micro_batches]
            if self.ministage_group:  # no STEP among the actions: nothing to call on one
                loss_sum = self.executor.run(forward_only, inputs, targets, self.loss_weight, None)
            else:
                loss_sum = self.executor.run(forward_only, inputs, targets, self.loss_weight)
            if self.is_last and self.groups.dp is not None:
                dist.all_reduce(loss_sum, group=self.groups.dp)
        return loss_sum

    def step(self, batch: torch.Tensor, lr: float) -> StepResult:
        """One optimizer step on the global `batch` (sequences of seq_len + 1 tokens) at learning rate `lr`."""
        with self.on_chip():
            return self._step(batch, lr)

    def _step(self, batch: torch.Tensor, lr: float) -> StepResult:
        micro_batches = self.replica_micro_batches(batch)
        inputs = [mb[:, :-1].to(self.device) for mb in micro_batches]
        targets = [mb[:, 1:].to(self.device) for mb in micro_batches]
        bytes_before = self.p2p.bytes_sent
        if self.recorder is not None:
            self.recorder.step += 1
        totals = torch.zeros(len(self.norm_slot) + 1, dtype=torch.float64)
        self.optimizer.reduced_gradient_elements = 0
        if self.ministage_group:
            loss_sum, stepped = self._run_ministages(inputs, targets, lr, totals)
        else:
            loss_sum, stepped = self.executor.run(self.actions, inputs, targets, self.loss_weight), False
            with span(self.recorder if self.stage_info.dp > 1 else None, "gradients over dp", "all-reduce",
                      ranks=self.stage_info.dp):
                self.optimizer.reduce_gradients()
            if self.tied_group is not None:
                sum_tied_gradient(self.optimizer.params[self.tied_index].grad, self.tied_group)
            self._add_squared_norms(totals, range(len(self.optimizer.params)))
        # One all-reduce over every rank: each model parameter's squared gradient norm (summed over
        # its TP pieces, exact in float64 for a whole tensor) and the bytes sent across stages.
        with span(self.recorder, "gradient norm", "all-reduce", ranks=self.topology.world_size):
            totals[-1] = float(self.p2p.bytes_sent - bytes_before)
            dist.all_reduce(totals, group=self.groups.everyone)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        with span(self.recorder, "clip and update", "optimizer"):
            global_norm = torch.linalg.vector_norm(totals[:-1].sqrt().float())
            if stepped:
                grad_norm = float(global_norm)
            elif self.ministage_group:
                grad_norm = self._deferred_ministage_steps(global_norm, max_norm, lr)
            else:
                grad_norm = float(global_norm)
                self.optimizer.scale_gradients(clip_coefficient(global_norm, max_norm))
                self.optimizer.step(lr)
                self.optimizer.zero_grad()
        if self.is_last and self.groups.dp is not None:
            with span(self.recorder, "loss over dp", "all-reduce", ranks=self.stage_info.dp):
                dist.all_reduce(loss_sum, group=self.groups.dp)
        return StepResult(loss=loss_sum, grad_norm=grad_norm, cross_stage_bytes=int(totals[-1]))
