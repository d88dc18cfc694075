"""Data parallelism for one stage's shard of the model: gradient all-reduce over the stage's replicas,
the global gradient-norm clip across every stage and shard, and AdamW with optionally sharded state
(ZeRO-1: each replica keeps optimizer state for, and updates, only the parameters it owns, then
broadcasts them to the other replicas; ZeRO-2: the same, and gradients are reduced to their owner
only, so each replica keeps about 1/dp of the gradient elements once they are reduced).

ZeRO-2 shards by whole parameters (the owner of each is the least-loaded replica, largest first) and
reduces each owner's gradients to it, rather than through FSDP2 (`fully_shard(reshard_after_forward=
False)`, which does run on the CPU over gloo: a two-rank check gave each rank its dim-0 shard of every
gradient). Why not FSDP2 here: the ministage schedule needs what Zorse's authors had to change in FSDP
(parameters kept gathered across all micro-batches of a ministage's backward, then offloaded; a step
per ministage), the engine's checkpoints, TP wrappers and global-norm slots work on whole local
tensors, not DTensors, and FSDP2 on the dipu device over DiComm was never tried. Per-parameter
ownership gives the same memory property (each replica keeps ~1/dp of the reduced gradient and of
the optimizer state) with one reduce per owner instead of one reduce-scatter.

AdamW matches the reference trainer's `build_adamw`: decay on matrices only, the same betas, the
same per-element update, so the sharded and the single-device runs compute the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

OPTIMIZER_SHARDING = ("none", "zero1", "zero2")


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def assign_owners(sizes: list[int], dp: int) -> list[int]:
    """Owner replica of each parameter: largest first, each to the least-loaded replica (ties: lowest)."""
    load, owner = [0] * dp, [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(dp), key=lambda r: (load[r], r))
        owner[index] = target
        load[target] += sizes[index]
    return owner


class StageOptimizer:
    """AdamW over one rank's stage parameters, with DP gradient reduction and ZeRO-1 if asked."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], *, lr: float, betas: tuple[float, float],
                 weight_decay: float, dp_group, dp_rank: int, dp_size: int, sharding: str = "none"):
        if sharding not in OPTIMIZER_SHARDING:
            raise ValueError(f"optimizer sharding must be one of {OPTIMIZER_SHARDING}, got {sharding!r}")
        self.names = [name for name, _ in named_params]
        self.params = [param for _, param in named_params]
        self.dp_group, self.dp_rank, self.dp_size = dp_group, dp_rank, dp_size
        self.sharding = sharding if dp_size > 1 else "none"
        if self.sharding in ("zero1", "zero2"):
            self.owner = assign_owners([p.numel() for p in self.params], dp_size)
        else:
            self.owner = [dp_rank] * len(self.params)
        owned = [p for p, o in zip(self.params, self.owner) if o == dp_rank]
        groups = [{"params": [p for p in owned if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in owned if p.dim() < 2], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas)
        self.reduced_gradient_elements = 0  # what the last step's reduce_gradients left on this rank

    def owned_state_elements(self) -> int:
        """Parameter elements whose optimizer state this rank keeps."""
        return sum(p.numel() for p, o in zip(self.params, self.owner) if o == self.dp_rank)

    def reduce_gradients(self, indices: list[int] | None = None) -> None:
        """Sum the gradients of parameters `indices` (default: all) over the stage's data-parallel
        replicas: one coalesced all-reduce, or under ZeRO-2 one reduce per owner, after which only
        the owner keeps a parameter's gradient."""
        indices = list(range(len(self.params))) if indices is None else list(indices)
        for index in indices:
            if self.params[index].grad is None:
                self.params[index].grad = torch.zeros_like(self.params[index])
        if self.dp_size == 1:
            self._count_reduced(indices)
            return
        if self.sharding != "zero2":
            grads = [self.params[i].grad for i in indices]
            flat = _flat(grads)
            dist.all_reduce(flat, group=self.dp_group)
            _unflat_into(flat, grads)
            self._count_reduced(indices)
            return
        for replica in range(self.dp_size):
            grads = [self.params[i].grad for i in indices if self.owner[i] == replica]
            if grads:
                flat = _flat(grads)
                dist.reduce(flat, group_dst=replica, group=self.dp_group)
                if replica == self.dp_rank:
                    _unflat_into(flat, grads)
        for index in indices:
            if self.owner[index] != self.dp_rank:
                self.params[index].grad = None
        self._count_reduced(indices)

    def _count_reduced(self, indices) -> None:
        """Add the reduced gradient elements of `indices` this rank keeps to the count (which the
        engine zeroes at each step: a ministage group reduces chunk by chunk)."""
        self.reduced_gradient_elements += sum(self.params[i].grad.numel() for i in indices
                                              if self.params[i].grad is not None)

    def holds_reduced_gradient(self, index: int) -> bool:
        """Whether this replica counts parameter `index`'s reduced gradient in the global norm: its
        owner under ZeRO-2 (the only one that holds it), replica 0 otherwise."""
        return self.owner[index] == self.dp_rank if self.sharding == "zero2" else self.dp_rank == 0

    def grad_norms(self, counted: list[bool], indices: list[int] | None = None) -> list[torch.Tensor]:
        """The L2 norm of the gradient of each parameter (of `indices`, default all) this rank counts
        for the global norm."""
        indices = range(len(self.params)) if indices is None else indices
        return [torch.linalg.vector_norm(self.params[i].grad) for i in indices if counted[i]]

    def step(self, lr: float, indices: list[int] | None = None) -> None:
        """Update the parameters that hold a gradient (torch's AdamW skips the rest: a ministage
        steps its own parameters alone), then share the owners' updates of `indices` (default all)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        if self.sharding in ("zero1", "zero2"):
            self._broadcast_owned(range(len(self.params)) if indices is None else indices)

    def _broadcast_owned(self, indices) -> None:
        chosen = set(indices)
        for replica in range(self.dp_size):
            mine = [p.data for i, (p, o) in enumerate(zip(self.params, self.owner)) if o == replica and i in chosen]
            if not mine:
                continue
            flat = (_flat(mine) if replica == self.dp_rank else torch.empty(sum(
                p.numel() for p in mine), dtype=mine[0].dtype, device=mine[0].device))
            dist.broadcast(flat, group_src=replica, group=self.dp_group)
            if replica != self.dp_rank:
                _unflat_into(flat, mine)

    def zero_grad(self, indices: list[int] | None = None) -> None:
        for index in range(len(self.params)) if indices is None else indices:
            self.params[index].grad = None


def clip_by_global_norm(norm: torch.Tensor, params: list[nn.Parameter], max_norm: float) -> float:
    """Scale `params`' gradients by min(1, max_norm / (norm + 1e-6)), torch's clip_grad_norm_ formula.

    `norm` is the norm over every stage and shard (each element counted once in the world; see
    PipelineEngine.step). Returns it as a float.
    """
    if max_norm > 0 and math.isfinite(max_norm):
        coefficient = clip_coefficient(norm, max_norm)
        for param in params:
            if param.grad is not None:  # ZeRO-2: only the owner holds a reduced gradient
                param.grad.mul_(coefficient)
    return float(norm)


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> float:
    """min(1, max_norm / (norm + 1e-6)) as torch's clip_grad_norm_ computes it (1.0 without a limit)."""
    if not (max_norm > 0 and math.isfinite(max_norm)):
        return 1.0
    return torch.clamp(max_norm / (norm + 1e-6), max=1.0).item()  # an fp32 value: same products
