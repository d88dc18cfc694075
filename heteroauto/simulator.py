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

Several replicas (`simulate_replicas`): each replica runs its own action lists on its own stages; a
boundary whose link crosses sites (`SharedLink`) is one link for all replicas. Either it carries one
message at a time at its full bandwidth in the order of a global send list per direction (JEEVES's
coordinated schedule, heteroauto.jeeves), or, with no list, the replicas split its bandwidth evenly and
each replica's messages queue on its share (every replica sending at once). `critical_path_bounds`
gives the two lower bounds an iteration cannot beat (JEEVES section 3.2).

Against the cost model (alpha = 1): with no transfers and no update a 1F1B replay equals
sum_i T_i + (b - 1) * max_i T_i whenever the slowest stage is the last one (uniform stages included);
with the slowest stage earlier it differs: shorter when every stage's backward is the same multiple of
its forward, and it can be longer when those ratios differ. With transfers the cost model charges each
boundary twice to its upstream stage, which bounds the replay from above when backward is the same
multiple of forward everywhere (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from h2.core.schedule import Action
from h2.core.trace import span_event, track_name_event, track_order_event
from heteroauto.jeeves import JeevesSchedule, Message, PipelineCosts
from heteroauto.stage_terms import StageTerms


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
    # per stage: the most micro-batches whose activations it held at once (forward run, backward not)
    peak_in_flight: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SharedLink:
    """A boundary's link shared by all replicas (it crosses sites): one micro-batch's occupancy at the
    link's full bandwidth, its latency, and optionally the global send list per direction ("F", "B")."""
    occupancy_s: float
    latency_s: float
    send_lists: Mapping[str, Sequence[Message]] | None = None


def shared_links_of(pipeline: PipelineCosts, schedule: JeevesSchedule | None = None) -> dict[int, SharedLink]:
    """The pipeline's shared (cross-site) boundaries as SharedLinks: with the generated schedule's
    global send lists, or without (the replicas split the bandwidth)."""
    return {
        b: SharedLink(pipeline.occupancy_s[b], pipeline.latency_s[b],
                      None if schedule is None else {d: schedule.send_lists[(b, d)] for d in "FB"})
        for b, shared in enumerate(pipeline.shared) if shared
    }


class _Queue:
    """One link direction: messages leave in order when the link is free, arrive a latency later. A
    queue with a send order (a shared link's global send list) holds each message until its turn."""

    def __init__(self, occupancy_s: float, latency_s: float, order: Sequence[Message] | None = None):
        self.occupancy_s = occupancy_s
        self.latency_s = latency_s
        self.free_at = 0.0
        self.order = list(order) if order is not None else None
        self.next = 0
        self.posted: dict[Message, float] = {}

    def post(self, now: float, message: Message, occupancy_s: float | None = None,
             latency_s: float | None = None) -> list[tuple[Message, float, float]]:
        """(message, leaves, arrives) of every message this post lets leave. A queue without a send
        order takes the message's own occupancy and latency where given (a per-boundary link)."""
        if self.order is None:
            return [self._send(message, now, occupancy_s, latency_s)]
        self.posted[message] = now
        sent = []
        while self.next < len(self.order) and self.order[self.next] in self.posted:
            head = self.order[self.next]
            sent.append(self._send(head, self.posted.pop(head)))
            self.next += 1
        return sent

    def _send(self, message: Message, posted: float, occupancy_s: float | None = None,
              latency_s: float | None = None) -> tuple[Message, float, float]:
        occupancy = self.occupancy_s if occupancy_s is None else occupancy_s
        latency = self.latency_s if latency_s is None else latency_s
        start = max(posted, self.free_at)
        self.free_at = start + occupancy
        return message, start, self.free_at + latency


def simulate(schedule: Sequence[Sequence[Action]], terms: Sequence[StageTerms], *, transfers: bool = True,
             keep_timeline: bool = False) -> SimulationResult:
    """One replica's pipeline on its own links."""
    return simulate_replicas([schedule], terms, transfers=transfers, keep_timeline=keep_timeline)


def simulate_replicas(schedules: Sequence[Sequence[Sequence[Action]]], terms: Sequence[StageTerms], *,
                      shared_links: Mapping[int, SharedLink] | None = None, transfers: bool = True,
                      keep_timeline: bool = False) -> SimulationResult:
    """Replay every replica's action lists (schedules[replica][stage]) together; the per-stage fields
    of the result (busy, bubble, finish, timeline) are replica 0's, peak_in_flight the most over
    replicas. `shared_links` maps a boundary (stage i to i + 1) to its SharedLink."""
    replicas = len(schedules)
    num_stages = len(schedules[0])
    chunks = 1 + max((a.chunk for stages in schedules for actions in stages
                      for a in actions if a.chunk is not None), default=0)
    if len(terms) != num_stages * chunks:
        raise ValueError(f"{len(terms)} stage terms for {num_stages * chunks} stages")
    if any(len(stages) != num_stages for stages in schedules):
        raise ValueError("every replica needs one action list per stage")
    shared_links = dict(shared_links or {})
    if shared_links and chunks > 1:
        raise ValueError("shared (cross-site) links are simulated for schedules without ministages")

    def ministage(action: Action) -> int:
        return action.stage if action.chunk is None else action.chunk * num_stages + action.stage

    split = any(a.kind == "W" for stages in schedules for actions in stages for a in actions)
    lanes = [(r, s) for r in range(replicas) for s in range(num_stages)]
    stepped = {(r, s): any(a.kind == "STEP" for a in schedules[r][s]) for r, s in lanes}
    updates = {lane: 0.0 for lane in lanes}
    clock = {lane: 0.0 for lane in lanes}
    busy = {lane: 0.0 for lane in lanes}
    held = {lane: 0 for lane in lanes}
    peak = {lane: 0 for lane in lanes}
    cursor = {lane: 0 for lane in lanes}
    arrivals: dict[tuple[str, int, int, int], float] = {}  # (kind, replica, receiving ministage, micro-batch)
    queues: dict[tuple, _Queue] = {}
    timeline: list[list[tuple[str, float, float]]] = [[] for _ in range(num_stages)]
    sent = 0

    def queue(replica: int, device: int, boundary: int, peer_device: int, direction: str) -> _Queue:
        """The link a message crosses: a shared boundary's one queue, else this replica's link from
        `device` to `peer_device` (ministages of one device pair share it)."""
        link = shared_links.get(boundary)
        if link is None:
            key: tuple = (replica, device, peer_device)
            if key not in queues:
                queues[key] = _Queue(0.0, 0.0)
            return queues[key]
        key = (-1 if link.send_lists is not None else replica, boundary, direction)
        if key not in queues:
            if not transfers:
                queues[key] = _Queue(0.0, 0.0)
            elif link.send_lists is None:  # the replicas split the bandwidth
                queues[key] = _Queue(link.occupancy_s * replicas, link.latency_s)
            else:
                queues[key] = _Queue(link.occupancy_s, link.latency_s, link.send_lists[direction])
        return queues[key]

    def duration(stage: int, kind: str) -> float:
        cost = terms[stage]
        if kind == "F":
            return cost.forward_s
        if kind == "B":
            return cost.backward_s - cost.weight_grad_s if split else cost.backward_s
        return cost.weight_grad_s

    remaining = sum(len(actions) for stages in schedules for actions in stages)
    while remaining:
        progressed = False
        for lane in lanes:
            replica, stage = lane
            actions = schedules[replica][stage]
            record = keep_timeline and replica == 0
            while cursor[lane] < len(actions):
                action = actions[cursor[lane]]
                kind = action.kind
                if kind in ("RECV_F", "RECV_B"):
                    key = (kind[-1], replica, ministage(action), action.micro_batch)
                    if key not in arrivals:
                        break
                    arrived = arrivals.pop(key)
                    if record and arrived > clock[lane]:
                        timeline[stage].append((str(action), clock[lane], arrived))
                    clock[lane] = max(clock[lane], arrived)
                elif kind in ("SEND_F", "SEND_B"):
                    direction = kind[-1]
                    here = ministage(action)
                    peer = here + 1 if direction == "F" else here - 1
                    boundary = min(here, peer)
                    link = queue(replica, stage, boundary, peer % num_stages, direction)
                    own = (() if boundary in shared_links else
                           (terms[boundary].send_occupancy_s, terms[boundary].send_latency_s) if transfers else (0.0,
                                                                                                                 0.0))
                    posted = Message(replica, action.micro_batch)
                    for message, start, arrival in link.post(clock[lane], posted, *own):
                        if keep_timeline and message.replica == 0:
                            label = str(action) if message == posted else f"{kind}{message.micro_batch}"
                            timeline[stage].append((label, start, arrival))
                        arrivals[(direction, message.replica, peer, message.micro_batch)] = arrival
                    sent += 1
                elif kind == "STEP":
                    took = terms[ministage(action)].update_s
                    if record:
                        timeline[stage].append(("update", clock[lane], clock[lane] + took))
                    clock[lane] += took
                    updates[lane] += took
                else:
                    took = duration(ministage(action), kind)
                    if record:
                        timeline[stage].append((str(action), clock[lane], clock[lane] + took))
                    clock[lane] += took
                    busy[lane] += took
                    held[lane] += {"F": 1, "B": -1}.get(kind, 0)
                    peak[lane] = max(peak[lane], held[lane])
                cursor[lane] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [
                f"replica {r} stage {s}: {schedules[r][s][cursor[(r, s)]]}" for r, s in lanes
                if cursor[(r, s)] < len(schedules[r][s])
            ]
            raise ValueError("schedule deadlocks: " + "; ".join(stuck[:8]))
    for lane in lanes:
        if not stepped[lane]:
            updates[lane] = terms[lane[1]].update_s
    finish_all = {lane: clock[lane] + (0.0 if stepped[lane] else updates[lane]) for lane in lanes}
    finish = [finish_all[(0, s)] for s in range(num_stages)]
    if keep_timeline:
        for s in range(num_stages):
            if not stepped[(0, s)]:
                timeline[s].append(("update", clock[(0, s)], finish[s]))
    iteration = max(finish_all.values())
    bubble = [iteration - busy[(0, s)] - updates[(0, s)] for s in range(num_stages)]
    return SimulationResult(iteration_s=iteration, busy_s=[busy[(0, s)] for s in range(num_stages)], bubble_s=bubble,
                            finish_s=finish, transfers=sent, timeline=timeline, peak_in_flight=[
                                max(peak[(r, s)] for r in range(replicas)) for s in range(num_stages)
                            ])


@dataclass(frozen=True)
class CriticalPathBounds:
    """Two lower bounds of an iteration (JEEVES section 3.2): the slowest stage's compute with the
    first micro-batch's way in and the last one's way out (compute-dominant), and the busiest shared
    link carrying every replica's micro-batches one after another (communication-dominant)."""
    compute_s: float
    communication_s: float

    @property
    def bound_s(self) -> float:
        return max(self.compute_s, self.communication_s)


def critical_path_bounds(terms: Sequence[StageTerms], micro_batches: int, *, replicas: int = 1,
                         shared_links: Mapping[int, SharedLink] | None = None) -> CriticalPathBounds:
    """Lower bounds of simulate_replicas' iteration for any schedule with `micro_batches` per replica."""
    shared_links = dict(shared_links or {})
    num_stages = len(terms)

    def hop(boundary: int) -> float:  # one message alone on its link
        link = shared_links.get(boundary)
        if link is not None:
            return link.occupancy_s + link.latency_s
        return terms[boundary].send_s

    forward = [t.forward_s for t in terms]
    backward = [t.backward_s for t in terms]
    way_in = [sum(forward[j] + hop(j) for j in range(s)) for s in range(num_stages)]  # mb 0 reaches stage s
    way_out = [sum(backward[j] + hop(j) for j in range(s)) for s in range(num_stages)]  # a gradient leaves s
    update_0 = terms[0].update_s
    compute = max(way_in[s] + micro_batches * (forward[s] + backward[s]) + max(way_out[s] + update_0, terms[s].update_s)
                  for s in range(num_stages))
    communication = 0.0
    for boundary, link in shared_links.items():
        carried = replicas * micro_batches * link.occupancy_s
        above = range(boundary + 1, num_stages)
        down_from_top = sum(backward[j] for j in above) + sum(hop(j) for j in range(boundary + 1, num_stages - 1))
        # forward direction: mb 0 reaches the link, every message crosses, the last one goes up and back
        forward_path = (way_in[boundary] + forward[boundary] + carried + link.latency_s +
                        sum(forward[j] for j in above) + sum(hop(j) for j in range(boundary + 1, num_stages - 1)) +
                        down_from_top + hop(boundary) + way_out[boundary] + backward[boundary] + update_0)
        # backward direction: mb 0's first gradient reaches the link, every message crosses, then down
        backward_path = (way_in[num_stages - 1] + forward[num_stages - 1] + down_from_top + carried + link.latency_s +
                         way_out[boundary] + backward[boundary] + update_0)
        communication = max(communication, forward_path, backward_path)
    return CriticalPathBounds(compute_s=compute, communication_s=communication)


_SPAN_KIND = {
    "F": "forward", "W": "backward-weight", "SEND_F": "send", "SEND_B": "send", "RECV_F": "recv", "RECV_B": "recv",
    "update": "optimizer"
}


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
