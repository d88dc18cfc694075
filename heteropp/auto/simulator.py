"""Event-driven replay of a pipeline schedule (heteropp.schedule action lists) with per-stage costs.

Each stage runs its actions in order on one clock. Compute actions (F, B, W) take the stage's time
for one micro-batch; SEND puts a message on the link to the neighbour (links carry one message at a
time per direction, so transfers queue); RECV waits for the message. After its last action a stage
runs its optimizer update. The iteration ends when the last stage's update ends.

Against the cost model (alpha = 1, no transfers, no update): a 1F1B replay equals
sum_i T_i + (b - 1) * max_i T_i whenever the slowest stage is the last one (uniform stages included).
With the slowest stage earlier it differs: shorter when every stage's backward is the same multiple of
its forward (later stages catch up), and it can be longer when those ratios differ between stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from h2.core.schedule import Action
from h2.core.trace import span_event, track_name_event, track_order_event


@dataclass(frozen=True)
class StageCost:
    forward_s: float
    backward_s: float          # input and weight gradients plus recompute, as one B in plain 1F1B
    weight_grad_s: float = 0.0  # the part of backward_s a W action takes in the split variant
    update_s: float = 0.0


@dataclass
class SimulationResult:
    iteration_s: float
    busy_s: list[float]
    bubble_s: list[float]
    finish_s: list[float]
    transfers: int
    # per stage: (action, start, end) of compute, of waits for a receive, of each send's transfer on
    # its link (from leaving to arriving) and of the update
    timeline: list[list[tuple[str, float, float]]] = field(default_factory=list)


TransferTime = Callable[[int, int, str, int], float]  # (src stage, dst stage, "F" or "B", micro_batch) -> s


def no_transfer_cost(src: int, dst: int, kind: str, micro_batch: int) -> float:
    return 0.0


def simulate(schedule: Sequence[Sequence[Action]], costs: Sequence[StageCost],
             transfer_s: TransferTime = no_transfer_cost, keep_timeline: bool = False) -> SimulationResult:
    num_stages = len(schedule)
    if len(costs) != num_stages:
        raise ValueError(f"{len(costs)} stage costs for {num_stages} stages")
    split = any(a.kind == "W" for actions in schedule for a in actions)
    clock = [0.0] * num_stages
    busy = [0.0] * num_stages
    cursor = [0] * num_stages
    arrivals: dict[tuple[str, int, int], float] = {}   # (kind, receiving stage, micro-batch) -> time
    link_free: dict[tuple[int, int], float] = {}
    timeline: list[list[tuple[str, float, float]]] = [[] for _ in range(num_stages)]
    transfers = 0

    def duration(stage: int, kind: str) -> float:
        cost = costs[stage]
        if kind == "F":
            return cost.forward_s
        if kind == "B":
            return cost.backward_s - cost.weight_grad_s if split else cost.backward_s
        return cost.weight_grad_s

    remaining = sum(len(actions) for actions in schedule)
    while remaining:
        progressed = False
        for stage in range(num_stages):
            actions = schedule[stage]
            while cursor[stage] < len(actions):
                action = actions[cursor[stage]]
                kind = action.kind
                if kind in ("RECV_F", "RECV_B"):
                    key = (kind[-1], stage, action.micro_batch)
                    if key not in arrivals:
                        break
                    arrived = arrivals.pop(key)
                    if keep_timeline and arrived > clock[stage]:
                        timeline[stage].append((str(action), clock[stage], arrived))
                    clock[stage] = max(clock[stage], arrived)
                elif kind in ("SEND_F", "SEND_B"):
                    direction = kind[-1]
                    peer = stage + 1 if direction == "F" else stage - 1
                    start = max(clock[stage], link_free.get((stage, peer), 0.0))
                    arrival = start + transfer_s(stage, peer, direction, action.micro_batch)
                    link_free[(stage, peer)] = arrival
                    if keep_timeline:
                        timeline[stage].append((str(action), start, arrival))
                    arrivals[(direction, peer, action.micro_batch)] = arrival
                    transfers += 1
                else:
                    took = duration(stage, kind)
                    if keep_timeline:
                        timeline[stage].append((str(action), clock[stage], clock[stage] + took))
                    clock[stage] += took
                    busy[stage] += took
                cursor[stage] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [f"stage {s}: {schedule[s][cursor[s]]}" for s in range(num_stages) if cursor[s] < len(schedule[s])]
            raise ValueError("schedule deadlocks: " + "; ".join(stuck))
    finish = [clock[s] + costs[s].update_s for s in range(num_stages)]
    if keep_timeline:
        for s in range(num_stages):
            timeline[s].append(("update", clock[s], finish[s]))
    iteration = max(finish)
    bubble = [iteration - busy[s] - costs[s].update_s for s in range(num_stages)]
    return SimulationResult(iteration_s=iteration, busy_s=busy, bubble_s=bubble, finish_s=finish,
                            transfers=transfers, timeline=timeline)


_SPAN_KIND = {"F": "forward", "W": "backward-weight", "SEND_F": "send", "SEND_B": "send", "RECV_F": "recv",
              "RECV_B": "recv", "update": "optimizer"}


def trace_events(result: SimulationResult, stage_labels: Sequence[str], split_backward: bool) -> list[dict]:
    """The simulated timeline (simulate(..., keep_timeline=True)) as trace events (h2.core.trace): one
    track per stage, transfers on a second lane of the sending stage (a send overlaps its compute)."""
    events = []
    for stage, label in enumerate(stage_labels):
        events += [track_name_event(stage, f"stage {stage}: {label} (predicted)"), track_order_event(stage)]
        for name, start, end in result.timeline[stage]:
            prefix = name.rstrip("0123456789")
            kind = ("backward-input" if split_backward else "backward") if prefix == "B" else _SPAN_KIND[prefix]
            events.append(span_event(name, kind, start, end, stage, lane=1 if kind == "send" else 0))
    return events
