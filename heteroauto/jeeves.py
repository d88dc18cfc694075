"""JEEVES's schedule generator: pipeline action lists found by list scheduling over a simulated timeline.

A pipeline whose stages sit in different sites (datacenters) stalls on 1F1B's fixed order when the
cross-site link is slow. JEEVES (HotNets '25) fixes no order in advance: it replays the timeline and
lets each stage run whatever is ready as soon as it is idle, under two rules:

- a memory counter per stage (one per micro-batch whose activations it holds: +1 when a forward
  starts, -1 when its backward ends) may not exceed the stage's limit k, so a stage runs ahead by at
  most k micro-batches;
- when a forward and a backward are both ready, the backward runs first (it frees memory here and
  lets the stages before it free theirs sooner).

Senders never wait for an acknowledgement: a message leaves as soon as the link is free and arrives a
latency later (the arrival rule of h2.core.links). A cross-site link is shared by all replicas and
carries one message at a time at its full bandwidth, in the order of one global send list per
direction: messages in the order they were posted, replicas alternating on ties. Links inside a site
are per replica.

The order each stage ran its operations in is the schedule: per replica, per stage, a list of actions
in the IR of h2.core.schedule (RECV_F F SEND_F / RECV_B B SEND_B), which the executor runs and the
simulator replays; the global send lists come with it, so a replay is exactly the generated timeline.

Pure Python: must not import torch or anything of the project above core.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

from h2.core.errors import UserError
from h2.core.schedule import Action, with_transfers


@dataclass(frozen=True)
class PipelineCosts:
    """One replica's pipeline, per micro-batch: each stage's forward and backward seconds, and per
    boundary (stage i to i+1, both directions) the link's occupancy at its full bandwidth and its
    latency; `shared[i]` marks a boundary whose link all replicas share (it crosses sites)."""
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    occupancy_s: tuple[float, ...]
    latency_s: tuple[float, ...]
    shared: tuple[bool, ...]

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)

    def check(self, source: str = "pipeline") -> None:
        stages = self.num_stages
        if stages < 1 or len(self.backward_s) != stages:
            raise UserError(f"{source}: need one forward and one backward time per stage, got "
                            f"{len(self.forward_s)} and {len(self.backward_s)}")
        for name in ("occupancy_s", "latency_s", "shared"):
            if len(getattr(self, name)) != stages - 1:
                raise UserError(f"{source}: {name} needs one value per stage boundary ({stages - 1}), "
                                f"got {len(getattr(self, name))}")
        for name in ("forward_s", "backward_s", "occupancy_s", "latency_s"):
            for index, value in enumerate(getattr(self, name)):
                if not (value >= 0 and math.isfinite(value)):
                    raise UserError(f"{source}: {name}[{index}] must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class Message:
    """One message on a link: which replica's micro-batch, and its direction ("F" or "B")."""
    replica: int
    micro_batch: int


@dataclass
class JeevesSchedule:
    """The generated schedule: actions[replica][stage] (IR action lists), send_lists[(boundary,
    direction)] for each shared boundary (the global order of its messages), the peak number of
    micro-batches each stage held (max over replicas), and the generated timeline's end (the last
    backward; updates not included)."""
    actions: list[list[list[Action]]]
    send_lists: dict[tuple[int, str], list[Message]]
    peak_in_flight: list[int]
    makespan_s: float
    limits: list[int] = field(default_factory=list)
    # (replica, stage, "F" or "B", micro-batch) -> when its input was ready there, and when it started
    ready_s: dict[tuple[int, int, str, int], float] = field(default_factory=dict)
    start_s: dict[tuple[int, int, str, int], float] = field(default_factory=dict)

    def stage_actions(self, stage: int, replica: int = 0) -> list[Action]:
        return self.actions[replica][stage]


def limits_per_stage(limits: int | Sequence[int], num_stages: int, source: str = "jeeves") -> list[int]:
    """k for every stage from one number or one per stage; k < 1 is a one-line error."""
    values = [limits] * num_stages if isinstance(limits, int) else list(limits)
    if len(values) != num_stages:
        raise UserError(f"{source}: in-flight limits: need one per stage ({num_stages}), got {len(values)}")
    for stage, k in enumerate(values):
        if not isinstance(k, int) or k < 1:
            raise UserError(f"{source}: in-flight limit k of stage {stage} must be an integer >= 1 "
                            f"(one micro-batch), got {k}")
    return values


class _Link:
    """One direction of one boundary: FIFO at full bandwidth; the message leaves when the link is
    free and arrives a latency after its last byte left."""

    def __init__(self, occupancy_s: float, latency_s: float):
        self.occupancy_s = occupancy_s
        self.latency_s = latency_s
        self.free_at = 0.0
        self.order: list[Message] = []

    def post(self, now: float, message: Message) -> float:
        start = max(now, self.free_at)
        self.free_at = start + self.occupancy_s
        self.order.append(message)
        return self.free_at + self.latency_s


def jeeves_schedule(costs: PipelineCosts, micro_batches: int, limits: int | Sequence[int], *, replicas: int = 1,
                    source: str = "jeeves") -> JeevesSchedule:
    """List-schedule `micro_batches` per replica through the pipeline `costs` with in-flight limit k
    per stage (`limits`: one number or one per stage). See the module docstring for the rules."""
    costs.check(source)
    num_stages = costs.num_stages
    k = limits_per_stage(limits, num_stages, source)
    if micro_batches < 1 or replicas < 1:
        raise UserError(f"{source}: need at least one micro-batch and one replica, got {micro_batches} and {replicas}")
    last = num_stages - 1

    links: dict[tuple[int, int, str], _Link] = {}  # (replica or -1 when shared, boundary, direction)

    def link(replica: int, boundary: int, direction: str) -> _Link:
        key = (-1 if costs.shared[boundary] else replica, boundary, direction)
        if key not in links:
            links[key] = _Link(costs.occupancy_s[boundary], costs.latency_s[boundary])
        return links[key]

    workers = [(r, s) for r in range(replicas) for s in range(num_stages)]
    ready_forward = {w: [] for w in workers}  # micro-batches whose input has arrived, in order
    ready_backward = {w: [] for w in workers}  # micro-batches whose gradient has arrived (a heap)
    next_forward = {w: 0 for w in workers}
    in_flight = {w: 0 for w in workers}
    peak = {w: 0 for w in workers}
    busy = {w: False for w in workers}
    order: dict[tuple[int, int], list[tuple[str, int]]] = {w: [] for w in workers}
    ready_s: dict[tuple[int, int, str, int], float] = {}
    start_s: dict[tuple[int, int, str, int], float] = {}
    for r in range(replicas):
        ready_forward[(r, 0)] = list(range(micro_batches))
        ready_s.update({(r, 0, "F", m): 0.0 for m in range(micro_batches)})

    events: list[tuple[float, int, str, tuple[int, int], int]] = []  # (time, seq, kind, worker, micro-batch)
    sequence = 0

    def push(time: float, kind: str, worker: tuple[int, int], micro_batch: int) -> None:
        nonlocal sequence
        heapq.heappush(events, (time, sequence, kind, worker, micro_batch))
        sequence += 1

    def try_start(worker: tuple[int, int], now: float) -> None:
        stage = worker[1]
        if ready_backward[worker]:
            micro_batch = heapq.heappop(ready_backward[worker])
            order[worker].append(("B", micro_batch))
            start_s[(*worker, "B", micro_batch)] = now
            busy[worker] = True
            push(now + costs.backward_s[stage], "B_done", worker, micro_batch)
            return
        forwards = ready_forward[worker]
        if forwards and forwards[0] == next_forward[worker] and in_flight[worker] < k[stage]:
            micro_batch = forwards.pop(0)
            next_forward[worker] += 1
            in_flight[worker] += 1
            peak[worker] = max(peak[worker], in_flight[worker])
            order[worker].append(("F", micro_batch))
            start_s[(*worker, "F", micro_batch)] = now
            busy[worker] = True
            push(now + costs.forward_s[stage], "F_done", worker, micro_batch)

    makespan = 0.0
    done = 0
    now = 0.0
    touched = set(workers)  # workers whose state changed at `now`: only they may start something
    while True:
        for worker in sorted(touched):
            if not busy[worker]:
                try_start(worker, now)
        touched = set()
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, worker, micro_batch = heapq.heappop(events)
            replica, stage = worker
            touched.add(worker)
            if kind == "F_done":
                busy[worker] = False
                if stage == last:
                    heapq.heappush(ready_backward[worker], micro_batch)
                    ready_s[(*worker, "B", micro_batch)] = now
                else:
                    arrival = link(replica, stage, "F").post(now, Message(replica, micro_batch))
                    push(arrival, "F_arrive", (replica, stage + 1), micro_batch)
            elif kind == "B_done":
                busy[worker] = False
                in_flight[worker] -= 1
                done += 1
                makespan = max(makespan, now)
                if stage > 0:
                    arrival = link(replica, stage - 1, "B").post(now, Message(replica, micro_batch))
                    push(arrival, "B_arrive", (replica, stage - 1), micro_batch)
            elif kind == "F_arrive":
                forwards = ready_forward[worker]
                forwards.append(micro_batch)
                forwards.sort()
                ready_s[(*worker, "F", micro_batch)] = now
            else:
                heapq.heappush(ready_backward[worker], micro_batch)
                ready_s[(*worker, "B", micro_batch)] = now
    expected = replicas * num_stages * micro_batches
    if done != expected:
        raise UserError(f"{source}: the schedule cannot finish ({done} of {expected} backwards ran)")

    actions = [[_actions_of(order[(r, s)], s, num_stages) for s in range(num_stages)] for r in range(replicas)]
    send_lists = {(boundary, direction): l.order for (owner, boundary, direction), l in sorted(links.items())
                  if owner == -1}
    peak_per_stage = [max(peak[(r, s)] for r in range(replicas)) for s in range(num_stages)]
    return JeevesSchedule(actions=actions, send_lists=send_lists, peak_in_flight=peak_per_stage, makespan_s=makespan,
                          limits=k, ready_s=ready_s, start_s=start_s)


def _actions_of(compute: list[tuple[str, int]], stage: int, num_stages: int) -> list[Action]:
    return [action for kind, micro_batch in compute for action in with_transfers(kind, stage, num_stages, micro_batch)]
