"""Explicit per-stage orders in a strategy file: the compute actions each stage runs, in order, so a
schedule generated elsewhere (the JEEVES generator, a hand-written one) runs exactly as simulated.

    schedule: jeeves
    orders:                       # one line per stage: F<m> / B<m> (and W<m> with a split backward)
      - F0 F1 F2 F3 B0 B1 B2 B3
      - F0 B0 F1 B1 F2 B2 F3 B3

A stage's communication follows from its compute, as in every schedule of h2.core.schedule: RECV_F
before a forward and SEND_F after it (except at the pipeline's ends), RECV_B before a backward and
SEND_B after it. Orders are checked on load: every micro-batch's forward and backward once per stage,
each backward after its forward, and the stages together must not deadlock (a replay of the
dependencies alone); a bad order is a one-line UserError naming the file and the stage.

Pure Python: no torch, nothing of the project above core.
"""

from __future__ import annotations

import re
from typing import Sequence

from h2.core.errors import UserError
from h2.core.schedule import Action, Schedule, resolve_schedule, schedule_actions, with_transfers

_TOKEN = re.compile(r"([FBW])(\d+)")


def parse_order(text, stage: int, num_stages: int, micro_batches: int, where: str) -> list[Action]:
    """One stage's order line as its full action list (module doc); a UserError naming `where`."""
    if not isinstance(text, str) or not text.split():
        raise UserError(f"{where}: expected a line of actions like 'F0 F1 B0 B1', got {text!r}")
    compute: list[tuple[str, int]] = []
    for token in text.split():
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise UserError(f"{where}: '{token}' is not an action (F<m>, B<m> or W<m>)")
        kind, micro_batch = match.group(1), int(match.group(2))
        if micro_batch >= micro_batches:
            raise UserError(f"{where}: '{token}': micro-batch {micro_batch} does not exist "
                            f"(micro_batches is {micro_batches})")
        compute.append((kind, micro_batch))
    _check_each_once(compute, micro_batches, where)
    return _with_communication(compute, stage, num_stages)


def _check_each_once(compute: list[tuple[str, int]], micro_batches: int, where: str) -> None:
    split = any(kind == "W" for kind, _ in compute)
    kinds = ("F", "B", "W") if split else ("F", "B")
    done: set[tuple[str, int]] = set()
    for kind, micro_batch in compute:
        if (kind, micro_batch) in done:
            raise UserError(f"{where}: '{kind}{micro_batch}' is listed twice")
        before = kinds[kinds.index(kind) - 1] if kind != "F" else None
        if before is not None and (before, micro_batch) not in done:
            raise UserError(f"{where}: '{kind}{micro_batch}' comes before '{before}{micro_batch}'")
        done.add((kind, micro_batch))
    missing = [f"{kind}{m}" for m in range(micro_batches) for kind in kinds if (kind, m) not in done]
    if missing:
        raise UserError(f"{where}: '{missing[0]}' is missing (every micro-batch's {'/'.join(kinds)} runs once)")


def _with_communication(compute: list[tuple[str, int]], stage: int, num_stages: int) -> list[Action]:
    actions: list[Action] = []
    for kind, micro_batch in compute:
        if kind in ("F", "B"):
            actions += with_transfers(kind, stage, num_stages, micro_batch)
        else:
            actions.append(Action("W", stage, micro_batch))
    return actions


def format_order(actions: Sequence[Action]) -> str:
    """A stage's action list as its order line: the compute actions only."""
    return " ".join(str(action) for action in actions if action.kind in ("F", "B", "W"))


def orders_of(schedule: Sequence[Sequence[Action]]) -> list[str]:
    """A whole schedule's order lines, one per stage (what a strategy's `orders` field holds)."""
    return [format_order(actions) for actions in schedule]


def parse_orders(orders, num_stages: int, micro_batches: int, source: str) -> list[list[Action]]:
    """A strategy's `orders` field as the schedule it runs, checked (module doc)."""
    if not isinstance(orders, list) or len(orders) != num_stages:
        count = len(orders) if isinstance(orders, list) else "not a list"
        raise UserError(f"{source}: field 'orders' must list one order per stage ({num_stages}), got {count}")
    schedule = [
        parse_order(text, stage, num_stages, micro_batches, f"{source}: field 'orders[{stage}]'")
        for stage, text in enumerate(orders)
    ]
    check_no_deadlock(schedule, f"{source}: field 'orders'")
    return schedule


def check_no_deadlock(schedule: Sequence[Sequence[Action]], where: str) -> None:
    """Replay the cross-stage dependencies alone (a receive waits for its send; sends never block):
    a UserError naming where each stuck stage waits when the stages cannot all finish."""
    sent: set[tuple[str, int, int]] = set()  # (direction, receiving stage, micro-batch)
    cursor = [0] * len(schedule)
    progressed = True
    while progressed:
        progressed = False
        for stage, actions in enumerate(schedule):
            while cursor[stage] < len(actions):
                action = actions[cursor[stage]]
                if action.kind in ("RECV_F", "RECV_B") and (action.kind[-1], stage, action.micro_batch) not in sent:
                    break
                if action.kind == "SEND_F":
                    sent.add(("F", stage + 1, action.micro_batch))
                elif action.kind == "SEND_B":
                    sent.add(("B", stage - 1, action.micro_batch))
                cursor[stage] += 1
                progressed = True
    stuck = [
        f"stage {stage} waits before {_compute_after(actions, cursor[stage])}" for stage, actions in enumerate(schedule)
        if cursor[stage] < len(actions)
    ]
    if stuck:
        raise UserError(f"{where}: the orders deadlock: " + "; ".join(stuck))


def _compute_after(actions: Sequence[Action], position: int) -> Action:
    return next((a for a in actions[position:] if a.kind in ("F", "B", "W")), actions[position])


def run_schedule(strategy, schedule: str | None = None, source: str = "strategy",
                 replica: int = 0) -> list[list[Action]]:
    """What the stages of `strategy`'s data-parallel replica `replica` run (the schedule
    h2.core.schedule.resolve_schedule picks with the `schedule` override): its explicit orders when it
    has them and they are of that schedule (the replica's own when the strategy has replica_orders);
    else the schedule's built-in action lists. A generated schedule without orders is a UserError."""
    resolved = resolve_schedule(strategy, schedule, source)
    stages, micro_batches = len(strategy.stages), strategy.micro_batches
    if runs_own_orders(strategy, resolved):
        orders = strategy.orders if strategy.replica_orders is None else strategy.replica_orders[replica]
        return parse_orders(orders, stages, micro_batches, source)
    if resolved.needs_orders:
        raise UserError(f"{source}: schedule '{resolved.name}' is generated from the cluster's costs: give the "
                        f"strategy per-stage orders (field 'orders') or run with --cluster, which generates them")
    return schedule_actions(resolved.name, stages, micro_batches, strategy.ministages)


def runs_own_orders(strategy, resolved: Schedule) -> bool:
    """Whether the strategy's `orders` are what runs: it has them, they are of the schedule that runs,
    and that schedule runs on the executor of per-stage orders (not the ministage one)."""
    return strategy.orders is not None and resolved.name == strategy.schedule and not resolved.ministage_executor


def needs_generated_orders(strategy, schedule: str | None = None, source: str = "strategy") -> bool:
    """Whether the schedule that runs (`schedule` override applied) must be generated for this job: it
    needs orders and the strategy carries none of its own for it."""
    resolved = resolve_schedule(strategy, schedule, source)
    return resolved.needs_orders and not runs_own_orders(strategy, resolved)


def format_send_list(boundary: int, direction: str, messages: Sequence[tuple[int, int]]) -> str:
    """One shared boundary's global send list in a direction ("F" or "B") as a strategy's send_lists entry."""
    return f"{boundary}{direction}: " + " ".join(f"{replica}.{micro_batch}" for replica, micro_batch in messages)


def parse_send_lists(entries, num_stages: int, replicas: int, micro_batches: int,
                     source: str) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """A strategy's send_lists field: (boundary, direction) -> [(replica, micro_batch)] in link order,
    every replica's every micro-batch exactly once."""
    where = f"{source}: field 'send_lists'"
    if not isinstance(entries, list):
        raise UserError(f"{where} must be a list of 'BOUNDARY DIRECTION: replica.micro_batch ...' lines")
    lists: dict[tuple[int, str], list[tuple[int, int]]] = {}
    everything = sorted((r, m) for r in range(replicas) for m in range(micro_batches))
    for index, entry in enumerate(entries):
        head, _, body = str(entry).partition(":")
        head = head.strip()
        try:
            key = (int(head[:-1]), head[-1])
            messages = [(int(r), int(m)) for r, m in (token.split(".") for token in body.split())]
        except (ValueError, IndexError):
            raise UserError(f"{where}[{index}]: expected 'BOUNDARY F|B: replica.micro_batch ...', got "
                            f"{str(entry)[:60]!r}") from None
        if key[1] not in "FB" or not 0 <= key[0] < num_stages - 1 or key in lists:
            raise UserError(f"{where}[{index}]: '{head}' is not a new boundary 0..{num_stages - 2} with F or B")
        if sorted(messages) != everything:
            raise UserError(f"{where}[{index}]: must list every replica's (0..{replicas - 1}) every micro-batch "
                            f"(0..{micro_batches - 1}) once")
        lists[key] = messages
    return lists


def check_replica_orders(strategy, source: str) -> None:
    """A strategy's replica_orders (one per-stage order list per replica, the first its `orders`) and
    send_lists, checked."""
    stages, micro_batches = len(strategy.stages), strategy.micro_batches
    if strategy.replica_orders is not None:
        where = f"{source}: field 'replica_orders'"
        replicas = {strategy.stage_dp(index) for index in range(stages)}
        if len(replicas) != 1 or not isinstance(strategy.replica_orders, list):
            raise UserError(f"{where} needs the same dp on every stage")
        if len(strategy.replica_orders) != strategy.stage_dp(0):
            raise UserError(f"{where} must list one per-stage order list per replica ({strategy.stage_dp(0)}), "
                            f"got {len(strategy.replica_orders)}")
        if strategy.orders is None or list(strategy.replica_orders[0]) != list(strategy.orders):
            raise UserError(f"{where}[0] must be the strategy's orders (replica 0 runs them)")
        for replica, orders in enumerate(strategy.replica_orders):
            parse_orders(orders, stages, micro_batches, f"{where}[{replica}]")
    if strategy.send_lists is not None:
        parse_send_lists(strategy.send_lists, stages, strategy.stage_dp(0), micro_batches, source)
