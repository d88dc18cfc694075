"""Embeddings tied to the output head across stages, as Megatron ties them: the first stage holds the
embedding and the last the head, each rank its own copy of the same tensor-parallel piece (both cut by
vocabulary rows); after every backward the two gradients are summed over a group of the two ranks
holding the same piece (same TP and DP index), so both copies take the same optimizer step and stay
equal, and the first stage alone counts the sum in the global norm. A stage holding both shares one
parameter instead (heteropp.tensor_parallel.apply_tp).

What this needs of a strategy (heteropp.job_checks refuses the rest before any rank starts): the first
and last stages of equal TP and DP sizes, one layer chunk per stage (no ministages, no offload), and
unsharded optimizer state and gradients.
"""

from __future__ import annotations

import torch.distributed as dist

from h2.core.errors import UserError
from h2.core.links import PeerLinks
from heteropp.groups import new_group
from heteropp.topology import Topology

EMBEDDING, HEAD = "embed.weight", "head.weight"


def check_tied_across_stages(strategy, sharding: str, source: str) -> None:
    """One line for what keeps a tied model's stages from training it (nothing for one stage or untied)."""
    model = strategy.model_config(source)
    if not model.tie_embeddings or len(strategy.stages) == 1:
        return
    first, last = 0, len(strategy.stages) - 1
    where = f"{source}: model '{model.name}' ties its embedding to its head across stages, which needs"
    if strategy.stages[first].tp != strategy.stages[last].tp:
        raise UserError(f"{where} the first and last stages' tp equal (got {strategy.stages[first].tp} and "
                        f"{strategy.stages[last].tp})")
    if strategy.stage_dp(first) != strategy.stage_dp(last):
        raise UserError(f"{where} the first and last stages' dp equal (got {strategy.stage_dp(first)} and "
                        f"{strategy.stage_dp(last)})")
    if strategy.ministages > 1 or strategy.offload:
        raise UserError(f"{where} one layer chunk per stage (no ministages or offload)")
    if sharding != "none":
        raise UserError(f"{where} optimizer_sharding none (got {sharding})")


def tied_group(topology: Topology, rank: int, backend: str, links: PeerLinks | None) -> dist.ProcessGroup | None:
    """This rank's pair of embedding and head holders (every rank takes part in building every pair)."""
    first, last = topology.stages[0], topology.stages[-1]
    mine = None
    for dp_index in range(first.dp):
        for tp_index in range(first.tp):
            members = [first.rank_of(dp_index, tp_index), last.rank_of(dp_index, tp_index)]
            group = new_group(members, backend, links)
            if rank in members:
                mine = group
    return mine


def sum_tied_gradient(grad, group: dist.ProcessGroup) -> None:
    """The embedding's and the head's gradients summed, in place, on both ranks of `group`."""
    dist.all_reduce(grad, group=group)
