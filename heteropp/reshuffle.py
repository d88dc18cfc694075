"""Zorse's dynamic micro-batch reshuffling between stages of uneven groups (the seed's 4.2): each
replica of a stage takes whole micro-batches, and the i-th micro-batch a stage finishes goes to the
replica of the next stage with the i-th most work left.

The plan, the same on every rank (`finish_order_destinations`): a replica's share of a step's
micro-batches is in proportion to its `rows` (the planner sets them in proportion to the chip's
speed; `replica_quotas`), so one micro-batch costs it 1 / rows; the replica with the most work left
(micro-batches still to come times their cost; ties: the slower chip, then the lower index) gets the
next finished micro-batch. Which micro-batch is the i-th finished is known only at run time: a
sender that has finished one takes the next number of its boundary's counter on the job's store
(`store.add`, atomic), publishes (micro-batch, its rank) under the receiver's next slot and sends the
activation there; a receiver reads its slots in order. Stage 0's replicas take micro-batch m as the
m-th finished (the data arrive in order). Gradients go back to the rank that sent the activation.

Runs in GPipe order (every forward of the step, then the backwards in reverse) on stages of TP 1
without ministages or offload (`check_reshuffle`). The loss is unchanged by the assignment: the
last stage weighs every micro-batch's mean loss by 1 / micro_batches and the replicas' gradients
are summed over the group (heteropp.data_parallel), whichever replica ran which micro-batch.
Must not import the engine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.distributed as dist

from h2.core.errors import UserError
from h2.model.transformer import language_model_loss
from heteropp.p2p import BACKWARD, FORWARD, P2P, message_tag
from heteropp.topology import RankPlace, Topology

STORE_PREFIX = "h2/reshuffle"


def replica_quotas(shares: list[int], micro_batches: int) -> list[int]:
    """The micro-batches each replica takes in a step: `micro_batches` in proportion to `shares`, by
    the largest remainder (ties: the larger share, then the lower index)."""
    total = sum(shares)
    exact = [Fraction(micro_batches * share, total) for share in shares]
    quotas = [int(value) for value in exact]
    by_remainder = sorted(range(len(shares)), key=lambda j: (-(exact[j] - quotas[j]), -shares[j], j))
    for j in by_remainder[:micro_batches - sum(quotas)]:
        quotas[j] += 1
    return quotas


def finish_order_destinations(shares: list[int], micro_batches: int) -> list[int]:
    """destinations[i]: the replica (of a stage with these `shares`) that takes the i-th finished
    micro-batch of the previous stage: the one with the most work left (module doc)."""
    left = replica_quotas(shares, micro_batches)
    destinations = []
    for _ in range(micro_batches):
        replica = max((j for j in range(len(shares)) if left[j] > 0), key=lambda j:
                      (Fraction(left[j], shares[j]), Fraction(1, shares[j]), -j))
        destinations.append(replica)
        left[replica] -= 1
    return destinations


def check_reshuffle(strategy, sharding: str, schedule_name: str, source: str = "strategy") -> None:
    """Refuse `reshuffle: true` where this runtime does not reshuffle (one line naming the field)."""
    if not strategy.reshuffle:
        return
    where = f"{source}: field 'reshuffle'"
    if schedule_name != "gpipe":
        raise UserError(f"{where}: reshuffling runs in GPipe order; set schedule: gpipe (got {schedule_name})")
    if strategy.ministages != 1 or strategy.offload:
        raise UserError(f"{where}: reshuffling runs without ministages or offload (got ministages "
                        f"{strategy.ministages}, offload {list(strategy.offload)})")
    if sharding == "zero2":
        raise UserError(f"{where}: reshuffling runs with optimizer_sharding none or zero1 (ZeRO-2 reduce-scatters "
                        f"once per micro-batch, and reshuffled replicas run different numbers of them)")
    for index, stage in enumerate(strategy.stages):
        if stage.tp != 1:
            raise UserError(f"{where}: reshuffling runs on stages of tp 1, stages[{index}].tp is {stage.tp}")


@dataclass(frozen=True)
class Route:
    """Where one micro-batch went on this rank's boundary to the next stage, or came from."""
    micro_batch: int
    finish_index: int  # its number in the order the sending stage finished its micro-batches
    src: int  # global ranks
    dst: int


class ReshuffleExecutor:

    def __init__(self, stage: torch.nn.Module, *, topology: Topology, place: RankPlace, groups, p2p: P2P, store,
                 activation_shape: tuple[int, ...], micro_batches: int, device: torch.device,
                 autocast: torch.dtype | None = None, by_finish_order: bool = True):
        """`stage`: this rank's layers; `groups`: its process groups (the boundaries' for the p2p);
        `store`: the job's store (the finish counters and slots); `activation_shape`: one whole
        micro-batch's activation; `by_finish_order` False: micro-batch i goes where the i-th finished
        would (a static map, what the reshuffling is measured against)."""
        self.stage, self.topology, self.place, self.groups, self.p2p, self.store = (stage, topology, place, groups, p2p,
                                                                                    store)
        self.activation_shape, self.micro_batches = tuple(activation_shape), micro_batches
        self.device, self.autocast, self.by_finish_order = torch.device(device), autocast, by_finish_order
        index, self.num_stages = place.stage, topology.num_stages
        self.is_first, self.is_last = index == 0, index == topology.num_stages - 1
        self.destinations = [
            finish_order_destinations(self._shares(s), micro_batches) for s in range(topology.num_stages)
        ]
        self.runs = 0
        self.sent: list[Route] = []  # this rank's routes to the next stage in the last run
        self.received: list[Route] = []  # and from the previous one, in the order it ran them

    def _shares(self, stage: int) -> list[int]:
        info = self.topology.stages[stage]
        return [len(info.rows(d)) for d in range(info.dp)]

    def run(self, actions, tokens: list[torch.Tensor], targets: list[torch.Tensor], loss_scale: float) -> torch.Tensor:
        """One step's forwards (and, unless `actions` has no backward, backwards) on the micro-batches
        this rank is given; `tokens` / `targets`: every micro-batch of the step, whole. Returns the
        sum of this rank's scaled losses (last stage)."""
        self.runs += 1
        prefix = f"{STORE_PREFIX}/{self.runs}"
        self.sent, self.received = [], []
        forward_only = not any(action.kind == "B" for action in actions)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        ran: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (micro-batch, input, output) in order
        for micro_batch, x in self._inputs(prefix, tokens):
            with self._compute_precision():
                output = self.stage(x)
            if self.is_last:
                output = language_model_loss(output, targets[micro_batch]) * loss_scale
                loss_sum += output.detach()
            else:
                self._hand_on(prefix, micro_batch, output.detach())
            if not forward_only:
                ran.append((micro_batch, x, output))
        if not forward_only:
            self._backwards(ran)
        self.p2p.wait_sends()
        return loss_sum

    def _inputs(self, prefix: str, tokens: list[torch.Tensor]):
        """(micro-batch, input) in the order this rank runs them: stage 0 its micro-batches in order,
        every other stage what its slots receive, in the order the previous stage finished them."""
        mine = self.place.dp_index
        if self.is_first:
            for micro_batch, replica in enumerate(self.destinations[0]):
                if replica == mine:
                    yield micro_batch, tokens[micro_batch]
            return
        slots = self.destinations[self.place.stage].count(mine)
        pending = None
        for slot in range(slots):
            route, work, buffer = pending or self._post_slot(prefix, slot)
            work.wait()
            # the next slot's receive posted now if the store already names it (never waited for here)
            upcoming = slot + 1 < slots and self.store.check([self._slot_key(prefix, slot + 1)])
            pending = self._post_slot(prefix, slot + 1) if upcoming else None
            self.received.append(route)
            yield route.micro_batch, buffer.requires_grad_()

    def _slot_key(self, prefix: str, slot: int, stage: int | None = None, replica: int | None = None) -> str:
        """The store key naming what slot `slot` of a replica (default: this rank's) receives."""
        stage = self.place.stage if stage is None else stage
        replica = self.place.dp_index if replica is None else replica
        return f"{prefix}/{stage - 1}/to/{replica}/{slot}"

    def _post_slot(self, prefix: str, slot: int):
        """Wait for the store to name what slot `slot` of this replica receives, and post its receive."""
        key = self._slot_key(prefix, slot)
        micro_batch, finish_index, src = (int(value) for value in self.store.get(key).decode().split())
        self.store.delete_key(key)
        buffer = torch.empty(self.activation_shape, dtype=torch.float32, device=self.device)
        work = self.p2p.recv(buffer, src, self.groups.prev_boundary, message_tag(micro_batch, FORWARD))
        return Route(micro_batch, finish_index, src, self.place.rank), work, buffer

    def _hand_on(self, prefix: str, micro_batch: int, activation: torch.Tensor) -> None:
        """This stage finished `micro_batch`: take its finish number, name the next stage's replica
        with the most work left as its receiver, and send it there."""
        module = getattr(torch, self.device.type, None)
        if hasattr(module, "synchronize") and self.device.type != "cpu":
            module.synchronize(self.device)  # finished on the device, not only queued
        boundary = self.place.stage
        counter = f"{prefix}/{boundary}/finished"
        finish_index = self.store.add(counter, 1) - 1
        destinations = self.destinations[boundary + 1]
        position = finish_index if self.by_finish_order else micro_batch
        replica = destinations[position]
        slot = destinations[:position].count(replica)
        dst = self.topology.stages[boundary + 1].rank_of(replica, 0)
        self.store.set(self._slot_key(prefix, slot, boundary + 1, replica),
                       f"{micro_batch} {finish_index} {self.place.rank}")
        if finish_index == self.micro_batches - 1:
            self.store.delete_key(counter)
        self.p2p.send(activation, dst, self.groups.next_boundary, message_tag(micro_batch, FORWARD))
        self.sent.append(Route(micro_batch, finish_index, self.place.rank, dst))

    def _backwards(self, ran: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """The backwards in reverse order of the forwards: each output gradient from the rank the
        activation went to, each input gradient back to the rank it came from."""
        grads = {}
        if not self.is_last:
            for route in self.sent:
                buffer = torch.empty(self.activation_shape, dtype=torch.float32, device=self.device)
                grads[route.micro_batch] = (self.p2p.recv(buffer, route.dst, self.groups.next_boundary,
                                                          message_tag(route.micro_batch, BACKWARD)), buffer)
        sources = {route.micro_batch: route.src for route in self.received}
        for micro_batch, x, output in reversed(ran):
            grad = None
            if not self.is_last:
                work, grad = grads.pop(micro_batch)
                work.wait()
            torch.autograd.backward(output, grad_tensors=grad)
            if not self.is_first:
                self.p2p.send(x.grad, sources[micro_batch], self.groups.prev_boundary, message_tag(
                    micro_batch, BACKWARD))

    def _compute_precision(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)


def job_store():
    """The store every rank of the job shares (torch.distributed's default)."""
    return dist.distributed_c10d._get_default_store()
