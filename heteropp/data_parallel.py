"""Data parallelism for one stage's shard of the model: gradient all-reduce over the stage's replicas
(one chip type), the global gradient-norm clip across every stage and shard, and AdamW with
optionally sharded state (ZeRO-1: each replica keeps optimizer state for, and updates, only the
parameters it owns, then broadcasts them to the other replicas).

AdamW matches the reference trainer's `build_adamw`: decay on matrices only, the same betas, the
same per-element update, so the sharded and the single-device runs compute the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

OPTIMIZER_SHARDING = ("none", "zero1")


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
        if self.sharding == "zero1":
            self.owner = assign_owners([p.numel() for p in self.params], dp_size)
        else:
            self.owner = [dp_rank] * len(self.params)
        owned = [p for p, o in zip(self.params, self.owner) if o == dp_rank]
        groups = [{"params": [p for p in owned if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in owned if p.dim() < 2], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas)

    def owned_state_elements(self) -> int:
        """Parameter elements whose optimizer state this rank keeps."""
        return sum(p.numel() for p, o in zip(self.params, self.owner) if o == self.dp_rank)

    def reduce_gradients(self) -> None:
        """Sum gradients over the stage's data-parallel replicas (one coalesced all-reduce)."""
        for param in self.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        if self.dp_size == 1:
            return
        grads = [p.grad for p in self.params]
        flat = _flat(grads)
        dist.all_reduce(flat, group=self.dp_group)
        _unflat_into(flat, grads)

    def grad_norms(self, counted: list[bool]) -> list[torch.Tensor]:
        """The L2 norm of the gradient of each parameter this rank counts for the global norm."""
        return [torch.linalg.vector_norm(param.grad) for param, count in zip(self.params, counted) if count]

    def step(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        if self.sharding == "zero1":
            self._broadcast_owned()

    def _broadcast_owned(self) -> None:
        for replica in range(self.dp_size):
            mine = [p.data for p, o in zip(self.params, self.owner) if o == replica]
            if not mine:
                continue
            flat = (_flat(mine) if replica == self.dp_rank
                    else torch.empty(sum(p.numel() for p in mine), dtype=mine[0].dtype, device=mine[0].device))
            dist.broadcast(flat, group_src=replica, group=self.dp_group)
            if replica != self.dp_rank:
                _unflat_into(flat, mine)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None


def clip_by_global_norm(norm: torch.Tensor, params: list[nn.Parameter], max_norm: float) -> float:
    """Scale `params`' gradients by min(1, max_norm / (norm + 1e-6)), torch's clip_grad_norm_ formula.

    `norm` is the norm over every stage and shard (each element counted once in the world; see
    PipelineEngine.step). Returns it as a float.
    """
    if max_norm > 0 and math.isfinite(max_norm):
        coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0).item()  # an fp32 value: same products
        for param in params:
            param.grad.mul_(coefficient)
    return float(norm)
