"""Event-driven replay of a pipeline schedule (h2/core/schedule.py action lists) with per-stage terms.

Interleaved ministages (Zorse; h2.core.schedule.gpipe_ministages): list s is then the device of
stage s, holding chunks c = 0 .. m - 1; its action of chunk c takes the terms of ministage
c * stages + s (terms has one entry per ministage) and sends to the ministage before or after it,
on the link between the two devices; a STEP action runs that ministage's update on the spot, and a
list with STEP actions runs no update at its end.

Each stage runs its actions in order on one clock. Compute actions (F, B, W) take the stage's time for
one micro-batch (stage_terms.StageTerms: the same terms the closed-form cost model reads). SEND puts a
message on the link to the neighbour: the link (one per direction of each boundary) is busy for the
transfer's occupancy, so messages queue, and the message arrives a latency later; sends never block
the sender; RECV waits for the message. Both directions of boundary (i, i+1) carry stage i's
send terms. After its last action a stage runs its optimizer update. The iteration ends when the last
update ends.

Against the cost model (alpha = 1): with no transfers and no update a 1F1B replay equals
sum_i T_i + (b - 1) * max_i T_i whenever the slowest stage is the last one (uniform stages included);
with the slowest stage earlier it differs: shorter when every stage's backward is the same multiple of
its forward, and it can be longer when those ratios differ. With transfers the cost model charges each
boundary twice to its upstream stage, which bounds the replay from above when backward is the same
multiple of forward everywhere (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from h2.core.schedule import Action
from h2.core.trace import span_event, track_name_event, track_order_event
from heteropp.auto.stage_terms import StageTerms


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


def simulate(schedule: Sequence[Sequence[Action]], terms: Sequence[StageTerms], *, transfers: bool = True,
             keep_timeline: bool = False) -> SimulationResult:
    num_stages = len(schedule)
    chunks = 1 + max((a.chunk for actions in schedule for a in actions if a.chunk is not None), default=0)
    if len(terms) != num_stages * chunks:
        raise ValueError(f"{len(terms)} stage terms for {num_stages * chunks} stages")

    def ministage(action: Action) -> int:
        return action.stage if action.chunk is None else action.chunk * num_stages + action.stage

    stepped = [any(a.kind == "STEP" for a in actions) for actions in schedule]
    updates = [0.0] * num_stages
    split = any(a.kind == "W" for actions in schedule for a in actions)
    clock = [0.0] * num_stages
    busy = [0.0] * num_stages
    cursor = [0] * num_stages
    arrivals: dict[tuple[str, int, int], float] = {}   # (kind, receiving stage, micro-batch) -> time
    link_free: dict[tuple[int, int], float] = {}
    timeline: list[list[tuple[str, float, float]]] = [[] for _ in range(num_stages)]
    sent = 0

    def duration(stage: int, kind: str) -> float:
        cost = terms[stage]
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
                    key = (kind[-1], ministage(action), action.micro_batch)
                    if key not in arrivals:
                        break
                    arrived = arrivals.pop(key)
                    if keep_timeline and arrived > clock[stage]:
                        timeline[stage].append((str(action), clock[stage], arrived))
                    clock[stage] = max(clock[stage], arrived)
                elif kind in ("SEND_F", "SEND_B"):
                    direction = kind[-1]
                    here = ministage(action)
                    peer = here + 1 if direction == "F" else here - 1
                    boundary = terms[min(here, peer)]
                    occupancy, latency = ((boundary.send_occupancy_s, boundary.send_latency_s) if transfers
                                          else (0.0, 0.0))
                    link = (stage, peer % num_stages)
                    start = max(clock[stage], link_free.get(link, 0.0))
                    link_free[link] = start + occupancy
                    arrival = start + occupancy + latency
                    if keep_timeline:
                        timeline[stage].append((str(action), start, arrival))
                    arrivals[(direction, peer, action.micro_batch)] = arrival
                    sent += 1
                elif kind == "STEP":
                    took = terms[ministage(action)].update_s
                    if keep_timeline:
                        timeline[stage].append(("update", clock[stage], clock[stage] + took))
                    clock[stage] += took
                    updates[stage] += took
                else:
                    took = duration(ministage(action), kind)
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
    for s in range(num_stages):
        if not stepped[s]:
            updates[s] = terms[s].update_s
            if keep_timeline:
                timeline[s].append(("update", clock[s], clock[s] + updates[s]))
    finish = [clock[s] + (0.0 if stepped[s] else updates[s]) for s in range(num_stages)]
    iteration = max(finish)
    bubble = [iteration - busy[s] - updates[s] for s in range(num_stages)]
    return SimulationResult(iteration_s=iteration, busy_s=busy, bubble_s=bubble, finish_s=finish,
                            transfers=sent, timeline=timeline)


_SPAN_KIND = {"F": "forward", "W": "backward-weight", "SEND_F": "send", "SEND_B": "send", "RECV_F": "recv",
              "RECV_B": "recv", "update": "optimizer"}


def trace_events(result: SimulationResult, stage_labels: Sequence[str], split_backward: bool) -> list[dict]:
    """The simulated timeline (simulate(..., keep_timeline=True)) as trace events (h2.core.trace): one
    track per stage, transfers on a second lane of the sending stage (a send overlaps its compute)."""
    events = []
    for stage, label in enumerate(stage_labels):
        events += [track_name_event(stage, f"stage {stage}: {label} (predicted)"), track_order_event(stage)]
        for name, start, end in result.timeline[stage]:
            prefix = name.split("/")[0].rstrip("0123456789")
            kind = ("backward-input" if split_backward else "backward") if prefix == "B" else _SPAN_KIND[prefix]
            events.append(span_event(name, kind, start, end, stage, lane=1 if kind == "send" else 0))
    return events
