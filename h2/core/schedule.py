"""Pipeline schedules as explicit action lists: one ordered list of actions per stage.

The HeteroPP executor runs these lists; the HeteroAuto simulator replays them with costs; tests print
them. The schedule IR shared by runtime and planner. Pure Python: must not import torch.

Kinds: F (forward), B (backward; input gradients only in the split variant), W (weight gradients,
split variant only), SEND_F / RECV_F (activations to / from the next / previous stage), SEND_B /
RECV_B (gradients to / from the previous / next stage), STEP (the optimizer step of one ministage's
parameters). Sends do not block; receives wait.

Ministages (Zorse): with m > 1 a stage holds m layer chunks (`chunk`); chunk c of stage s is the
model's chunk c * stages + s, so activations leave the last stage's chunk c for stage 0's chunk c + 1.
`gpipe_ministages` runs every forward of a chunk before the next chunk's, then the backwards in
reverse chunk order, and a chunk's STEP right after its last backward.

The registry (`REGISTRY`, name -> `Schedule`) is the one list of schedule names: what a strategy file,
a job file, `--schedule` and `PipelineOptions` accept (`ScheduleName`), which builder makes each one's
action lists, which one needs a strategy's explicit orders (jeeves), which one runs on the ministage
executor (gpipe), and its bubble coefficient for the planner. `resolve_schedule(strategy, override)`
is the one rule for which schedule a strategy runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from h2.core.errors import UserError

KINDS = ("F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "STEP")


@dataclass(frozen=True)
class Action:
    kind: str
    stage: int
    micro_batch: int
    chunk: int | None = None  # the ministage, in a schedule of ministages

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown action kind {self.kind!r} (known: {', '.join(KINDS)})")

    def __str__(self) -> str:
        if self.kind == "STEP":
            return f"STEP/{self.chunk}"
        return f"{self.kind}{self.micro_batch}" + ("" if self.chunk is None else f"/{self.chunk}")


def with_transfers(kind: str, stage: int, num_stages: int, micro_batch: int) -> list[Action]:
    """A forward ("F") or backward ("B") of `stage` with the receive before it and the send after it
    that its place in the pipeline needs."""
    return _forward(stage, num_stages, micro_batch) if kind == "F" else _backward(stage, num_stages, micro_batch)


def _forward(stage: int, num_stages: int, micro_batch: int) -> list[Action]:
    actions = [Action("RECV_F", stage, micro_batch)] if stage > 0 else []
    actions.append(Action("F", stage, micro_batch))
    if stage < num_stages - 1:
        actions.append(Action("SEND_F", stage, micro_batch))
    return actions


def _backward(stage: int, num_stages: int, micro_batch: int) -> list[Action]:
    actions = [Action("RECV_B", stage, micro_batch)] if stage < num_stages - 1 else []
    actions.append(Action("B", stage, micro_batch))
    if stage > 0:
        actions.append(Action("SEND_B", stage, micro_batch))
    return actions


def _check(num_stages: int, micro_batches: int) -> None:
    if num_stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got {num_stages} and {micro_batches}")


def one_f_one_b(num_stages: int, micro_batches: int) -> list[list[Action]]:
    """1F1B: stage s runs min(P - s - 1, b) warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards."""
    _check(num_stages, micro_batches)
    schedule = []
    for stage in range(num_stages):
        warmup = min(num_stages - stage - 1, micro_batches)
        actions: list[Action] = []
        for m in range(warmup):
            actions += _forward(stage, num_stages, m)
        for i in range(micro_batches - warmup):
            actions += _forward(stage, num_stages, warmup + i)
            actions += _backward(stage, num_stages, i)
        for m in range(micro_batches - warmup, micro_batches):
            actions += _backward(stage, num_stages, m)
        schedule.append(actions)
    return schedule


def one_f_one_b_split_backward(num_stages: int, micro_batches: int) -> list[list[Action]]:
    """1F1B with the backward split into B (input gradients, on the critical path) and W (weight
    gradients, deferrable), zero-bubble style: during warm-up and steady state stage s keeps up to
    P - 1 - s weight-gradient passes pending, so its input gradients go upstream sooner; in the drain
    phase it runs every pending W after each backward, filling the wait for the next gradient.
    (Not the full ZB-H1 schedule: with equal F, B and W times it removes a third of 1F1B's bubble at
    P=4, b=8; W passes are not interruptible, so on uneven stages it can be slightly slower than 1F1B.)"""
    _check(num_stages, micro_batches)
    schedule = []
    for stage, plain in enumerate(one_f_one_b(num_stages, micro_batches)):
        deferrable = num_stages - 1 - stage
        last_forward = max(i for i, a in enumerate(plain) if a.kind == "F")
        pending: list[int] = []
        actions: list[Action] = []
        for index, action in enumerate(plain):
            actions.append(action)
            if action.kind == "B":
                pending.append(action.micro_batch)
            if action.kind in ("B", "SEND_B") and _backward_done(action, stage):
                keep = 0 if index > last_forward else deferrable  # drain phase: fill the wait for the next gradient
                while len(pending) > keep:
                    actions.append(Action("W", stage, pending.pop(0)))
        actions += [Action("W", stage, m) for m in pending]
        schedule.append(actions)
    return schedule


def _backward_done(action: Action, stage: int) -> bool:
    """The last action of a backward block: SEND_B, or B on stage 0 (which sends nothing)."""
    return action.kind == "SEND_B" or stage == 0


def gpipe_ministages(num_stages: int, micro_batches: int, ministages: int) -> list[list[Action]]:
    """GPipe order over interleaved ministages (module doc). With one stage a chunk feeds the next on
    the same rank: the list has no communication."""
    _check(num_stages, micro_batches)
    if ministages < 1:
        raise ValueError(f"need at least one ministage, got {ministages}")
    last_stage, last_chunk = num_stages - 1, ministages - 1
    talks = num_stages > 1
    schedule = []
    for stage in range(num_stages):
        actions: list[Action] = []
        for chunk in range(ministages):
            for m in range(micro_batches):
                if talks and (stage, chunk) != (0, 0):
                    actions.append(Action("RECV_F", stage, m, chunk))
                actions.append(Action("F", stage, m, chunk))
                if talks and (stage, chunk) != (last_stage, last_chunk):
                    actions.append(Action("SEND_F", stage, m, chunk))
        for chunk in reversed(range(ministages)):
            for m in range(micro_batches):
                if talks and (stage, chunk) != (last_stage, last_chunk):
                    actions.append(Action("RECV_B", stage, m, chunk))
                actions.append(Action("B", stage, m, chunk))
                if talks and (stage, chunk) != (0, 0):
                    actions.append(Action("SEND_B", stage, m, chunk))
            actions.append(Action("STEP", stage, -1, chunk))
        schedule.append(actions)
    return schedule


Builder = Callable[[int, int, int], list[list[Action]]]  # (stages, micro-batches, ministages) -> action lists


@dataclass(frozen=True)
class Schedule:
    """One entry of the schedule registry. `build` is None for a schedule generated elsewhere (it needs
    a strategy's `orders`); `ministage_executor`: its action lists run on heteropp.ministages (chunks and
    a STEP per chunk) rather than on heteropp.executor; `alpha`: the bubble coefficient the planner's
    cost model prices it with (1 for 1F1B's bubble, 0 for zero-bubble); `splits_backward`: its backward
    runs as separate input- and weight-gradient actions (traces label the two)."""
    name: str
    build: Builder | None
    ministage_executor: bool = False
    alpha: float = 1.0
    splits_backward: bool = False

    @property
    def needs_orders(self) -> bool:
        return self.build is None


def _one_ministage(build: Callable[[int, int], list[list[Action]]]) -> Builder:

    def build_one(num_stages: int, micro_batches: int, ministages: int) -> list[list[Action]]:
        if ministages != 1:
            raise ValueError(f"this schedule runs one ministage per stage, got {ministages}")
        return build(num_stages, micro_batches)

    return build_one


REGISTRY: dict[str, Schedule] = {
    schedule.name: schedule for schedule in (
        Schedule("1f1b", _one_ministage(one_f_one_b)),
        Schedule("1f1b-split-backward", _one_ministage(one_f_one_b_split_backward), alpha=0.0, splits_backward=True),
        Schedule("jeeves", None),  # heteroauto.jeeves generates it from the stages' costs
        Schedule("gpipe", gpipe_ministages, ministage_executor=True),  # Zorse's: ministages, offload
    )
}
SCHEDULES = tuple(REGISTRY)
ScheduleName = Literal[SCHEDULES]  # what a strategy file, a job file and --schedule accept
MINISTAGE_SCHEDULE = "gpipe"  # what a strategy with ministages or offload runs


def schedule_named(name: str, where: str = "schedule") -> Schedule:
    """The registry's entry for `name`; a one-line UserError naming `where` for an unknown name."""
    if name not in REGISTRY:
        raise UserError(f"{where}: unknown schedule '{name}' (known: {', '.join(SCHEDULES)})")
    return REGISTRY[name]


def schedule_for_alpha(alpha: float) -> str:
    """The built-in schedule a planner's bubble coefficient stands for: zero-bubble at 0, else 1F1B."""
    return "1f1b-split-backward" if alpha == 0 else "1f1b"


def needs_ministages(strategy) -> bool:
    """Whether a strategy can run only in GPipe order over ministages: it has ministages or offload."""
    return strategy.ministages > 1 or bool(strategy.offload)


def resolve_schedule(strategy, override: str | None = None, source: str = "strategy") -> Schedule:
    """The schedule `strategy` runs, `override` (--schedule; None: the strategy's own) applied: a
    strategy with ministages or offload runs GPipe's (an override naming another is a one-line
    UserError); else the override, else the strategy's."""
    if override is not None:
        schedule_named(override, "--schedule")
    if needs_ministages(strategy):
        if override not in (None, MINISTAGE_SCHEDULE):
            raise UserError(f"--schedule {override} does not apply to a strategy with ministages or offload "
                            f"(they run in GPipe order)")
        return REGISTRY[MINISTAGE_SCHEDULE]
    return schedule_named(override or strategy.schedule, f"{source}: field 'schedule'")


def schedule_actions(name: str, num_stages: int, micro_batches: int, ministages: int = 1) -> list[list[Action]]:
    """The action lists of built-in schedule `name`; a ValueError for a generated or unknown one."""
    schedule = REGISTRY.get(name)
    if schedule is None:
        raise ValueError(f"unknown schedule {name!r} (known: {', '.join(SCHEDULES)})")
    if schedule.build is None:
        raise ValueError(f"schedule {name!r} has no fixed action lists: it is generated from the stages' costs "
                         "(heteroauto.jeeves) and run from a strategy's orders (h2.core.stage_orders.run_schedule)")
    return schedule.build(num_stages, micro_batches, ministages)


def format_schedule(schedule: list[list[Action]]) -> str:
    """One line per stage with its compute actions, e.g. 'stage 0: F0 F1 B0 F2 B1 B2'."""
    return "\n".join(f"stage {s}: " + " ".join(str(a) for a in actions if a.kind in ("F", "B", "W"))
                     for s, actions in enumerate(schedule))
