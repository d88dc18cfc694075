"""Measuring what the planner needs of one chip type, by running the runtime's own stage code on it.

For a TP size t, `measure_tp` starts t local ranks (h2.core.ranks), each opening its device as the
chip (the emulated dipu device for a chip with an `emulation:` section, h2.core.emulation), with
the chip's collective backend inside the TP group (paced to the cluster's intra-node link where that
backend paces, as in a pipeline), and times on one micro-batch (the planner's micro_batch_size x
seq_len):
  - one decoder layer as HeteroPP runs it (heteropp.stage + heteropp.tensor_parallel): forward,
    forward + backward (backward = the difference), and the same layer under activation recompute
    (recompute = its extra time);
  - the bytes a layer holds from forward to backward, with and without recompute (autograd's saved
    storages and the output), and the device memory its backward needs beyond them (its workspace,
    where the device keeps memory statistics);
  - one optimizer update of the layer's shard as HeteroPP performs it (squared-norm sum, clip
    scaling, AdamW step);
  - the embedding (first stage) and the final norm + head + loss (last stage): forward and backward.
Each time is the median of `repeats` runs after warm-up runs, the slowest TP rank's (the group waits for
it). What cannot be run here is not measured: data-parallel synchronisation is derived by the
planner, which says so in the profile.

Runtime side (it runs stages); the planner (heteroauto) turns these numbers into its profile
format, so neither imports the other.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from h2.core.cluster import ChipType, ClusterSpec
from h2.core.errors import UserError
from h2.core.links import Location, RankLinks
from h2.core.model_config import ModelConfig
from h2.core.ranks import run_ranks
from h2.model.transformer import Transformer, language_model_loss
from heteropp.emulated_chip import load_chip_vendor, open_emulated_chip
from heteropp.groups import chip_backend, new_group
from heteropp.stage import RecomputedLayer, build_stage
from heteropp.tensor_parallel import apply_tp, check_tp_divides

TIMEOUT_S = 600


@dataclass(frozen=True)
class TPMeasurement:
    """One chip type at one TP size, one micro-batch, one chip of the TP group."""
    tp: int
    forward_s: float
    backward_s: float
    recompute_s: float
    activation_bytes: int  # held by one layer from its forward to its backward, no recompute
    recompute_activation_bytes: int  # the same under recompute
    workspace_bytes: int | None  # device memory a layer's backward needs beyond what is kept (None: no statistics)
    update_s: float  # optimizer update of one layer's shard
    embedding_forward_s: float
    embedding_backward_s: float
    head_forward_s: float  # final norm + head + loss
    head_backward_s: float
    device: str
    late_fraction: float  # emulated kernel time the host made late (0 when not emulated)


def _synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and hasattr(module, "synchronize"):
        module.synchronize()


class _Timer:
    """Wall times of callables over `repeats` rounds after warm-up runs (two back to back, so the host
    vendor has charged each kernel its warm CPU time), the slowest rank's (the TP
    group waits for it). `pair(base, longer)` runs the two alternately and returns the median of
    `base` and the median of the per-round differences `longer - base`: a slow spell of the host
    then shifts both runs of a round, not the difference."""

    def __init__(self, device: torch.device, group, repeats: int):
        self.device, self.group, self.repeats = device, group, repeats

    def _once(self, fn) -> float:
        _synchronize(self.device)
        if self.group is not None:
            dist.barrier(group=self.group)
        started = time.perf_counter()
        fn()
        _synchronize(self.device)
        return time.perf_counter() - started

    def _slowest_rank(self, value: float) -> float:
        value = torch.tensor([value], dtype=torch.float64)
        if self.group is not None:
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return float(value)

    def __call__(self, fn) -> float:
        fn(), fn()  # back to back, on a warm host: the vendor's charge per kernel settles (docs/emulation.md)
        return self._slowest_rank(statistics.median(self._once(fn) for _ in range(self.repeats)))

    def pair(self, base, longer) -> tuple[float, float]:
        base(), base(), longer(), longer()
        bases, differences = [], []
        for _ in range(self.repeats):
            first = self._once(base)
            bases.append(first)
            differences.append(self._once(longer) - first)
        return (self._slowest_rank(statistics.median(bases)),
                self._slowest_rank(max(statistics.median(differences), 0.0)))


def kept_bytes(module: torch.nn.Module, hidden: torch.Tensor) -> int:
    """Bytes `module` holds from its forward until its backward: the distinct storages autograd saves
    (its parameters and its input excluded: in a stack of layers the input is the previous layer's
    output) plus its output. A layer under activation recompute saves nothing outside its checkpoint,
    so it holds its output only."""
    storages: dict[int, int] = {}
    excluded = {p.untyped_storage().data_ptr() for p in module.parameters()} | {hidden.untyped_storage().data_ptr()}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = module(hidden)
    storages.setdefault(output.untyped_storage().data_ptr(), output.untyped_storage().nbytes())
    return sum(storages.values())


def _memory_module(device: torch.device):
    module = getattr(torch, device.type, None)
    return module if device.type != "cpu" and hasattr(module, "max_memory_allocated") else None


def _workspace_bytes(device: torch.device, module, hidden, grad, kept: int, rounds: int = 3) -> int | None:
    """Peak device memory of one forward + backward beyond what was allocated before and what the
    layer keeps (the median of `rounds`: the autograd thread may still be freeing the previous
    round's graph when the next one starts); None without device memory statistics."""
    memory = _memory_module(device)
    if memory is None:
        return None
    peaks = []
    for _ in range(rounds):
        _synchronize(device)
        before = memory.memory_allocated(device)
        memory.reset_peak_memory_stats(device)
        module(hidden).backward(grad)
        _synchronize(device)
        peaks.append(max(0, memory.max_memory_allocated(device) - before - kept))
    return int(statistics.median(peaks))


def _adamw_update(params: list[torch.nn.Parameter]):
    """HeteroPP's per-parameter update work (heteropp.data_parallel): the squared-norm sum, the clip
    scaling and an AdamW step (decay on matrices only)."""
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-4)

    def update():
        total = torch.zeros((), device=params[0].device)
        for param in params:
            total += param.grad.float().pow(2).sum()
        coefficient = torch.clamp(1.0 / (total.sqrt() + 1e-6), max=1.0).item()
        for param in params:
            param.grad.mul_(coefficient)
        optimizer.step()

    return update


def _measure_layer(timed: _Timer, layer, hidden, grad) -> dict:
    """Times and memory of one layer, then its optimizer update; frees its gradients and state."""
    recomputed = RecomputedLayer(layer)

    def forward():
        layer(hidden)

    def forward_backward(module=layer):
        module(hidden).backward(grad)

    forward_s, backward_s = timed.pair(forward, forward_backward)
    _, recompute_s = timed.pair(forward_backward, lambda: forward_backward(recomputed))
    activation_bytes = kept_bytes(layer, hidden)
    recompute_bytes = kept_bytes(recomputed, hidden)
    workspace = _workspace_bytes(timed.device, layer, hidden, grad, activation_bytes)
    update_s = timed(_adamw_update(list(layer.parameters())))
    hidden.grad = None
    return {
        "forward_s": forward_s, "backward_s": backward_s, "recompute_s": recompute_s,
        "activation_bytes": activation_bytes, "recompute_activation_bytes": recompute_bytes,
        "workspace_bytes": workspace, "update_s": update_s
    }


def _measure_stage_ends(timed: _Timer, shard, hidden, grad, tokens) -> dict:
    """Embedding (first stage) and final norm + head + loss (last stage), each on the device alone."""
    embedding = shard(True, range(0, 0), False)

    def embedding_forward():
        return embedding(tokens)

    embedding_forward_s, embedding_backward_s = timed.pair(embedding_forward,
                                                           lambda: embedding_forward().backward(grad))
    embedding = None  # its weights are freed before the head is built
    head = shard(False, range(0, 0), True)

    def head_forward():
        return language_model_loss(head(hidden), tokens)

    head_forward_s, head_backward_s = timed.pair(head_forward, lambda: head_forward().backward())
    hidden.grad = None
    return {
        "embedding_forward_s": embedding_forward_s, "embedding_backward_s": embedding_backward_s,
        "head_forward_s": head_forward_s, "head_backward_s": head_backward_s
    }


def _measure_rank(rank: int, world_size: int, chip: ChipType, model: ModelConfig, micro_batch_size: int, seq_len: int,
                  dtype_name: str, device_type: str, repeats: int, directory: str, cluster: ClusterSpec | None) -> dict:
    """One TP rank of `measure_tp` (runs in its own process)."""
    from datetime import timedelta

    from h2.core.devices import resolve_device

    torch.set_num_threads(1)
    load_chip_vendor(chip.dipu_vendor)
    if open_emulated_chip(chip, directory) is not None or chip.on_dipu:
        device_type = "dipu"
    device = resolve_device(device_type)
    if device.type != "cpu" and device.index is None:
        device = torch.device(device.type, rank % getattr(torch, device.type).device_count())
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    try:
        group = None
        if world_size > 1:
            ranks, backend = list(range(world_size)), chip_backend(chip.name, device.type)
            # A TP group sits in one node: its traffic crosses the cluster's intra-node link (h2.core.links).
            links = (RankLinks(cluster, [Location(chip.name, 0)] * world_size, rank) if cluster is not None else None)
            group = new_group(ranks, backend, links)
        dtype = getattr(torch, dtype_name)
        timed = _Timer(device, group, repeats)
        torch.manual_seed(0)
        full = Transformer(dataclasses.replace(model, num_layers=1))

        def shard(first: bool, layers: range, last: bool):
            stage = build_stage(full, layers, first=first, last=last)
            return apply_tp(stage, tp_index=rank, tp_size=world_size, group=group, store=None).to(device, dtype)

        shape = (micro_batch_size, seq_len, model.hidden_size)
        generator = torch.Generator().manual_seed(1)
        hidden = torch.randn(shape, generator=generator).to(device, dtype).requires_grad_()
        grad = torch.randn(shape, generator=generator).to(device, dtype)
        tokens = torch.randint(0, model.vocab_size, shape[:2], generator=generator).to(device)
        try:
            measured = _measure_layer(timed, shard(False, range(0, 1), False).layers[0], hidden, grad)
            measured.update(_measure_stage_ends(timed, shard, hidden, grad, tokens))
        except torch.OutOfMemoryError as error:
            return {"out_of_memory": str(error).strip().splitlines()[0]}
        pacing = getattr(getattr(torch, device.type, None), "pacing_stats", lambda: None)() or {}
        late = pacing.get("overrun_s", 0.0) / pacing["emulated_s"] if pacing.get("emulated_s") else 0.0
        return dataclasses.asdict(TPMeasurement(tp=world_size, device=str(device), late_fraction=late, **measured))
    finally:
        dist.destroy_process_group()


def measure_tp(chip: ChipType, model: ModelConfig, tp: int, *, micro_batch_size: int, seq_len: int,
               dtype: str = "float32", device: str = "cpu", repeats: int = 3, directory: str,
               cluster: ClusterSpec | None = None) -> TPMeasurement:
    """Measure `chip` at TP size `tp` on `tp` local ranks (`device`: where a chip without emulation
    runs; an emulated chip runs on its emulated dipu device, its vendor profile written to
    `directory`). With the chip's `cluster`, the TP group's traffic is paced to the cluster's
    intra-node link where the chip's backend paces (DiComm). Raises UserError when the model cannot be
    split `tp` ways or one layer does not fit."""
    check_tp_divides(model, tp, f"chip '{chip.name}': tp {tp}")
    os.makedirs(directory, exist_ok=True)
    results = run_ranks(_measure_rank, tp,
                        (chip, model, micro_batch_size, seq_len, dtype, device, repeats, directory, cluster),
                        timeout=TIMEOUT_S, start_method="forkserver", preload=["torch", "h2.model", "heteropp"])
    for result in results:
        if "out_of_memory" in result:
            raise UserError(f"chip '{chip.name}': field 'memory_gb': one layer of model '{model.name}' at tp {tp} with "
                            f"its optimizer state does not fit to be profiled ({result['out_of_memory']})")
    # Every rank of the group reports the same times (the slowest rank's); memory is per rank: take the largest.
    merged = dict(results[0])
    for key in ("activation_bytes", "recompute_activation_bytes", "workspace_bytes"):
        values = [r[key] for r in results if r[key] is not None]
        merged[key] = max(values) if values else None
    merged["late_fraction"] = max(r["late_fraction"] for r in results)
    return TPMeasurement(**merged)
