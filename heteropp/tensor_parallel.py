"""Megatron-style tensor parallelism inside one stage, with explicit collectives on the stage's TP group.

Stages of different TP sizes live in one world, so the layers are hand-written column/row-parallel
shards rather than DTensor on a global mesh. `apply_tp` turns a built stage into rank `tp_index`'s
shard of it, copying exactly that rank's slice of each full weight, so a TP run starts from the same
numbers as the single-device model of the same seed:
  q/k/v, gate/up, head          column-parallel (by heads, by intermediate features, by vocabulary)
  o, down                       row-parallel (partial sums, all-reduced once per block)
  embedding                     vocabulary-parallel (masked lookup, all-reduced)
  RMSNorm weights               replicated (their gradients agree across the group, see below)
Each attention / MLP block becomes copy_to_tp -> shard -> reduce_from_tp: one all-reduce forward,
one backward, per block. Inputs and outputs of every block are replicated over the group, so the
gradient reaching a norm weight is the same on every TP rank.

Under the split-backward schedule every linear gets a `WeightGradStore`: while it is deferring, the
linear's backward computes only the input gradient and leaves the weight gradient to a later W pass.
Without a store the linears are plain `F.linear`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from heteropp.stage_parameters import shard_of


# ---- collectives as autograd functions ---------------------------------------------------------
class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient backward (Megatron's f)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward; identity backward (Megatron's g)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherLastDim(torch.autograd.Function):
    """All-gather of the last dimension forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.rank, ctx.width = rank, x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous(), None


def copy_to_tp(x, group):
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return x if group is None else _ReduceFromTP.apply(x, group)


def gather_last_dim(x, group):
    return x if group is None else _GatherLastDim.apply(x, group)


# ---- linears whose weight gradient may be deferred ----------------------------------------------
class WeightGradStore:
    """Collects deferred weight-gradient work while `deferring`; `take()` hands it over."""

    def __init__(self):
        self.deferring = False
        self._pending: list[tuple[nn.Parameter, torch.Tensor, torch.Tensor, torch.dtype | None]] = []

    def defer(self, weight, inputs, grad_output, rounding: torch.dtype | None = None) -> None:
        self._pending.append((weight, inputs, grad_output, rounding))

    def take(self) -> list:
        pending, self._pending = self._pending, []
        return pending

    @staticmethod
    @torch.no_grad()
    def run(pending: list) -> None:
        """Accumulate the deferred weight gradients (the W pass; no graph is recorded)."""
        for weight, inputs, grad_output, rounding in pending:
            accumulate_grad(weight, _rounded(_weight_grad(inputs, grad_output), rounding).to(weight.dtype))


def _weight_grad(inputs: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    return grad_output.reshape(-1, grad_output.shape[-1]).t().mm(inputs.reshape(-1, inputs.shape[-1]))


def _rounded(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor if dtype is None else tensor.to(dtype)


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def accumulate_grad(param: nn.Parameter, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


class _Linear(torch.autograd.Function):
    """F.linear whose weight gradient may be deferred. Under autocast the product runs in the
    autocast dtype (F.linear casts both operands) and so does the backward, each gradient cast back
    to its operand's dtype, as autograd does through autocast's casts. With `rounding` (autocast
    off, `x` already rounded to it) the weight is rounded to `rounding` and the product computed in
    fp32: a GEMM of `rounding` operands with fp32 accumulation and output; the weight gradient is
    rounded to `rounding` as autocast's would be."""

    @staticmethod
    def forward(ctx, x, weight, store, rounding=None):
        ctx.save_for_backward(x, weight)
        # The parameter itself: under activation recompute the saved tensors unpack as aliases,
        # and a deferred gradient must land on the parameter the optimizer holds.
        ctx.parameter, ctx.store, ctx.rounding = weight, store, rounding
        output = F.linear(x, weight if rounding is None else weight.to(rounding).float())
        ctx.compute_dtype = output.dtype
        return output

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        dtype, rounding = ctx.compute_dtype, ctx.rounding
        operand = weight.to(dtype) if rounding is None else weight.to(rounding).float()
        grad_input = grad_output.matmul(operand).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            if ctx.store is not None and ctx.store.deferring:
                ctx.store.defer(ctx.parameter, x.to(dtype), grad_output, rounding)
            else:
                grad_weight = _rounded(_weight_grad(x.to(dtype), grad_output), rounding).to(weight.dtype)
        return grad_input, grad_weight, None, None


class ShardLinear(nn.Module):
    """A linear holding one shard (or all) of a weight [out, in] and of its bias [out] if it has one
    (column-parallel only), cut along `tp_split_dim` (0: column-parallel, 1: row-parallel, None: whole;
    heteropp.stage_parameters reads it). `partial_sums`: its outputs are partial sums that the TP group
    adds up (row-parallel); under autocast they are then left unrounded (the operands rounded, the
    product in fp32, as a low-precision GEMM with fp32 output), so the sum is rounded once, after the
    reduction, as the single-device product is."""

    def __init__(self, weight: torch.Tensor, store: WeightGradStore | None, partial_sums: bool = False,
                 tp_split_dim: int | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        assert bias is None or not partial_sums, "a row-parallel shard has no bias"
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.store, self.partial_sums, self.tp_split_dim = store, partial_sums, tp_split_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rounding = _autocast_dtype(x) if self.partial_sums else None
        if rounding is not None:
            with torch.autocast(x.device.type, enabled=False):
                x = x.to(rounding).float()
                if self.store is None:
                    return F.linear(x, self.weight.to(rounding).float())
                return _Linear.apply(x, self.weight, self.store, rounding)
        if self.store is None:  # no split-backward schedule: torch's own linear and backward
            return F.linear(x, self.weight, self.bias)
        output = _Linear.apply(x, self.weight, self.store)
        return output if self.bias is None else output + self.bias.to(output.dtype)

    def extra_repr(self) -> str:
        return f"out={self.weight.shape[0]}, in={self.weight.shape[1]}, bias={self.bias is not None}"


class ParallelBlock(nn.Module):
    """copy_to_tp -> inner (column- then row-parallel shards) -> reduce_from_tp. The partial sums are
    reduced in fp32; under autocast the sum is then rounded to the autocast dtype once, where the
    single-device product is rounded (the row-parallel shards leave their partial sums unrounded)."""

    wraps = "inner"  # the model's block; it stands where this one does (heteropp.stage_parameters)

    def __init__(self, inner: nn.Module, group):
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = reduce_from_tp(self.inner(copy_to_tp(x, self.group)).float(), self.group)
        return _rounded(total, _autocast_dtype(x)).to(x.dtype)


class ColumnParallelHead(nn.Module):
    """The output head split by vocabulary (`weight`: this rank's rows, cut along `tp_split_dim`);
    logits are gathered so the loss sees all of them."""

    wraps = "proj"  # the head's linear; its weight is the model's head weight (heteropp.stage_parameters)

    def __init__(self, weight: torch.Tensor, group, store, tp_split_dim: int | None = None):
        super().__init__()
        self.proj, self.group = ShardLinear(weight, store, tp_split_dim=tp_split_dim), group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Gathered in fp32 (exact for bf16 logits): the loss reads them in fp32 anyway, and every
        # backend gathers fp32.
        return gather_last_dim(self.proj(copy_to_tp(x, self.group)).float(), self.group)


class VocabParallelEmbedding(nn.Module):
    """Rows [first, first + rows) of the embedding (cut along `tp_split_dim`, None: all rows); other
    tokens look up zero, then all-reduce."""

    def __init__(self, weight: torch.Tensor, first: int, group, tp_split_dim: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.first, self.group, self.tp_split_dim = first, group, tp_split_dim

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return F.embedding(tokens, self.weight)
        local = tokens - self.first
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x = x.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(x, self.group)


# ---- applying TP to a built stage ---------------------------------------------------------------
def check_tp_divides(config: ModelConfig, tp: int, where: str) -> None:
    for name in ("num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        if getattr(config, name) % tp:
            raise UserError(f"{where}: tp {tp} does not divide the model's {name} ({getattr(config, name)})")


ROWS, COLUMNS = 0, 1  # the dimension of a weight [out, in] that column- and row-parallel layers cut


def apply_tp(stage: nn.Module, *, tp_index: int, tp_size: int, group, store: WeightGradStore | None) -> nn.Module:
    """Replace the stage's linears and embedding by this rank's shards (in place); returns the stage.
    Each shard records the dimension it was cut along (heteropp.stage_parameters reads it).

    With tp_size 1 the weights stay whole but still become `ShardLinear`s, so that with a `store`
    (the split-backward schedule) their weight gradients can be deferred.
    """
    group = group if tp_size > 1 else None
    t, n = tp_index, tp_size

    def cut(weight: torch.Tensor, dim: int) -> tuple[torch.Tensor, int | None]:
        return shard_of(weight, dim, t, n), dim if n > 1 else None

    def linear(module: nn.Linear, dim: int) -> ShardLinear:
        shard, split_dim = cut(module.weight, dim)
        bias = None if module.bias is None else cut(module.bias, dim)[0]  # column-parallel only (q, k, v)
        return ShardLinear(shard, store, partial_sums=dim == COLUMNS and group is not None, tp_split_dim=split_dim,
                           bias=bias)

    tied = stage.embed is not None and stage.head is not None and stage.head.weight is stage.embed.weight
    if stage.embed is not None:
        rows, split_dim = cut(stage.embed.weight, ROWS)
        stage.embed = VocabParallelEmbedding(rows, t * rows.shape[0], group, tp_split_dim=split_dim)
    for layer in stage.layers:
        attn, mlp = layer.attn, layer.mlp
        attn.q_proj = linear(attn.q_proj, ROWS)
        attn.k_proj = linear(attn.k_proj, ROWS)
        attn.v_proj = linear(attn.v_proj, ROWS)
        attn.o_proj = linear(attn.o_proj, COLUMNS)
        mlp.gate_proj = linear(mlp.gate_proj, ROWS)
        mlp.up_proj = linear(mlp.up_proj, ROWS)
        mlp.down_proj = linear(mlp.down_proj, COLUMNS)
        if group is not None:
            layer.attn = ParallelBlock(attn, group)
            layer.mlp = ParallelBlock(mlp, group)
    if stage.head is not None:
        rows, split_dim = cut(stage.head.weight, ROWS)
        stage.head = ColumnParallelHead(rows, group, store, tp_split_dim=split_dim)
    if tied:  # the same rows of the same tensor: one parameter, as in the model (heteropp.tied_embeddings)
        stage.head.proj.weight = stage.embed.weight
    return stage
