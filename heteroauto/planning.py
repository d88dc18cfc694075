"""HeteroAuto's planning steps on a loaded problem (heteroauto.problem): search a strategy and score it
(with the HeteroSpeedupRatio of each chip type alone), or score and replay a given strategy in the
event-driven simulator. `heteroauto search/simulate` and `h2 run/plan` call these; they print the results.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from h2.core.cluster import TrainingSpec
from h2.core.errors import UserError
from h2.core.schedule import schedule_actions, schedule_for_alpha, schedule_named
from h2.core.stage_orders import run_schedule
from h2.core.strategy import Strategy
from heteroauto import paper_search
from heteroauto.evaluation import StrategyReport, evaluate_strategy, training_for
from heteroauto.jeeves_plan import site_terms, with_schedule_orders
from heteroauto.oracle import oracle_search
from heteroauto.problem import PlanningProblem
from heteroauto.profiles import Profile
from heteroauto.search import Progress, SearchResult, search
from heteroauto.simulator import SimulationResult, simulate
from heteroauto.stage_terms import StageTerms


# ---- search -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchOptions:
    """The search's settings (heteroauto search's flags, checked there)."""
    method: str = "exact"  # exact | paper | exhaustive (the oracle)
    cost_model: str = "full"
    top_k: int = 1
    group_size: int | None = 128
    dp: int | None = None
    monotone_tp: bool = False
    time_limit_s: float | None = None
    gap: float = 0.0
    refine_all_dp: bool = False


@dataclass
class SearchOutcome:
    """The best strategy found, its score, and how the search went."""
    strategy: Strategy
    report: StrategyReport
    options: SearchOptions
    result: SearchResult | None  # None for the exhaustive search
    search_s: float
    search_cpu_s: float
    evaluated: int
    bounded: int
    hetero_speedup_ratio: float | None = None
    baselines: dict = field(default_factory=dict)
    speedup_baseline: str = "paper"  # SPEEDUP_BASELINES: which HeteroSpeedupRatio

    @property
    def method(self) -> str:
        return self.options.method

    @property
    def optimal(self) -> bool:
        return self.method == "exhaustive" or (self.result is not None and self.result.optimal)

    @property
    def gap(self) -> float | None:
        return 0.0 if self.method == "exhaustive" else (self.result.gap if self.method == "exact" else None)

    @property
    def lower_bound_s(self) -> float | None:
        return self.result.lower_bound_s if self.result is not None and self.method == "exact" else None

    @property
    def timed_out(self) -> bool:
        return bool(self.result is not None and self.result.timed_out)


def run_search(problem: PlanningProblem, profiles: dict[str, Profile], options: SearchOptions,
               progress: Callable[[Progress], None] | None = None) -> SearchResult:
    """The paper's procedure or the exact search (not the oracle) on `problem`."""
    cluster, model, training = problem.cluster, problem.model, problem.training
    if options.method == "paper":
        return paper_search.search(cluster, model, training, profiles, top_k=options.top_k,
                                   group_size=options.group_size, refine_all_dp=options.refine_all_dp, dp=options.dp)
    return search(cluster, model, training, profiles, cost_model=options.cost_model, top_k=options.top_k,
                  group_size=options.group_size, dp=options.dp, monotone_tp=options.monotone_tp, gap=options.gap,
                  time_limit_s=options.time_limit_s, progress=progress)


SPEEDUP_BASELINES = ("paper", "share")


def baseline_sequences(problem: PlanningProblem, chip_name: str, kind: str, baseline_tokens: int | None) -> int:
    """The global batch (sequences) chip type `chip_name` trains with alone for HeteroSpeedupRatio.

    `paper` (the H2 paper's definition, Section 6.2.1): every type alone with the same baseline batch,
    `baseline_tokens`, else the cluster file's `training.baseline_gbs_tokens` (its Table 6 runs: 2M tokens),
    else the run's own global batch. `share`: the type's chip share of the run's global batch."""
    cluster, training = problem.cluster, problem.training
    if kind == "share":
        return training.sequences * cluster.chip(chip_name).count // cluster.total_chips
    tokens = baseline_tokens or training.baseline_gbs_tokens or training.tokens
    return tokens // training.seq_len


def _divisible_batches(sequences: int, micro_batch_size: int) -> list[int]:
    """`sequences` rounded down to a whole number of micro-batches, then (for a batch the search cannot
    split, such as a prime number of micro-batches) to multiples of 2, 4, ... 1024 micro-batches."""
    units = sequences // micro_batch_size
    candidates = [units] + [units - units % step for step in (2**k for k in range(1, 11)) if units >= step]
    return list(dict.fromkeys(unit * micro_batch_size for unit in candidates if unit >= 1))


def _alone(problem: PlanningProblem, profiles: dict[str, Profile], options: SearchOptions, chip_name: str,
           wanted: int) -> dict:
    """Chip type `chip_name` searched alone with about `wanted` sequences per step: its best plan and TGS."""
    cluster, model, training = problem.cluster, problem.model, problem.training
    alone_options = dataclasses.replace(options, top_k=1, dp=None)
    batches = _divisible_batches(wanted, training.micro_batch_size)
    if not batches:
        return {"error": f"baseline batch of {wanted} sequences is less than one micro-batch"}
    errors = []
    for sequences in batches:
        alone = dataclasses.replace(training, global_batch_tokens=None, global_batch_sequences=sequences)
        alone_problem = dataclasses.replace(problem, cluster=cluster.only(chip_name), training=alone)
        try:
            result = run_search(alone_problem, profiles, alone_options)
        except UserError as error:
            errors.append(str(error))
            continue
        strategy = result.best.to_strategy(model, alone)
        iteration = evaluate_strategy(strategy, cluster, model, alone, profiles,
                                      cost_model=options.cost_model).iteration_s
        chips = cluster.chip(chip_name).count
        entry = {
            "chips": chips, "gbs_tokens": alone.tokens, "iteration_s": iteration,
            "tokens_per_chip_s": alone.tokens / iteration / chips, "dp": result.best.dp, "tp": list(result.best.tps),
            "pp": sum(result.best.pps), "recompute": list(result.best.recompute)
        }
        if sequences != wanted:
            entry["rounded_from_sequences"] = wanted
        return entry
    return {"error": errors[0]}


def baseline_ratio(problem: PlanningProblem, profiles: dict[str, Profile], tokens_per_s: float, options: SearchOptions,
                   baseline_tokens: int | None = None, kind: str = "paper") -> tuple[float | None, dict]:
    """HeteroSpeedupRatio = N * TGS / sum_i N_i * TGS_i, each type i alone searched the same way with the
    batch `baseline_sequences` gives it (rounded down to one the search can split, and said so)."""
    baselines, total = {}, 0.0
    for chip in problem.cluster.chips:
        wanted = baseline_sequences(problem, chip.name, kind, baseline_tokens)
        baselines[chip.name] = _alone(problem, profiles, options, chip.name, wanted)
        if "error" in baselines[chip.name]:
            return None, baselines
        total += chip.count * baselines[chip.name]["tokens_per_chip_s"]
    return tokens_per_s / total, baselines


def _searched(problem: PlanningProblem, profiles: dict[str, Profile], options: SearchOptions,
              progress: Callable[[Progress], None] | None) -> tuple[Strategy, SearchResult | None, tuple]:
    """The best strategy, the search's result (None for the oracle) and (seconds, CPU seconds, evaluated,
    bounded)."""
    schedule = schedule_for_alpha(problem.training.alpha)
    if options.method == "exhaustive":
        oracle = oracle_search(problem.cluster, problem.model, problem.training, profiles,
                               cost_model=options.cost_model, group_size=options.group_size, dp=options.dp,
                               monotone_tp=options.monotone_tp)
        return (dataclasses.replace(oracle.strategy, schedule=schedule), None, (oracle.search_s, oracle.search_cpu_s,
                                                                                oracle.evaluated, 0))
    result = run_search(problem, profiles, options, progress)
    return (result.best.to_strategy(problem.model, problem.training, schedule), result,
            (result.search_s, result.search_cpu_s, result.evaluated, result.bounded))


def search_strategy(problem: PlanningProblem, options: SearchOptions, *, baselines: bool = True, baseline_tokens: int
                    | None = None, speedup_baseline: str = "paper",
                    progress: Callable[[Progress], None] | None = None) -> SearchOutcome:
    """Search the best strategy of `problem`, score it with the cost model, and (`baselines`) search each
    chip type alone for its HeteroSpeedupRatio."""
    profiles = problem.profiles()
    strategy, result, (search_s, search_cpu_s, evaluated, bounded) = _searched(problem, profiles, options, progress)
    report = evaluate_strategy(strategy, problem.cluster, problem.model, problem.training, profiles,
                               cost_model=options.cost_model)
    outcome = SearchOutcome(strategy, report, options, result, search_s, search_cpu_s, evaluated, bounded)
    if baselines:
        outcome.hetero_speedup_ratio, outcome.baselines = baseline_ratio(
            problem, profiles, report.tokens_per_iteration / report.iteration_s, options, baseline_tokens,
            speedup_baseline)
        outcome.speedup_baseline = speedup_baseline
    return outcome


# ---- a planned strategy, replayed ----------------------------------------------------------------------
@dataclass
class PlannedStrategy:
    """A strategy with its cost-model score and its simulated step (the timeline kept for a trace)."""
    strategy: Strategy
    report: StrategyReport
    simulation: SimulationResult


def _replayed(strategy: Strategy, report: StrategyReport) -> PlannedStrategy:
    schedule = schedule_actions(strategy.schedule, len(strategy.stages), strategy.micro_batches)
    return PlannedStrategy(strategy, report, simulate(schedule, report.terms, keep_timeline=True))


def plan_strategy(problem: PlanningProblem) -> PlannedStrategy:
    """`h2 plan`'s plan: the search's best strategy on `problem`, scored by the cost model and replayed
    by the simulator."""
    profiles = problem.profiles()
    best = search(problem.cluster, problem.model, problem.training, profiles).best
    strategy = best.to_strategy(problem.model, problem.training, schedule_for_alpha(problem.training.alpha))
    return _replayed(strategy, evaluate_strategy(strategy, problem.cluster, problem.model, problem.training, profiles))


def replay_strategy(problem: PlanningProblem, strategy: Strategy, source: str) -> PlannedStrategy:
    """A strategy as it is (not searched again), scored and replayed on `problem`'s profiles."""
    training = training_for(strategy, problem.training)
    report = evaluate_strategy(strategy, problem.cluster, problem.model, training, problem.profiles(training),
                               source=source)
    return _replayed(strategy, report)


@dataclass
class SimulatedStrategy:
    """`heteroauto simulate`'s result: the strategy (with its generated orders), its cost-model report,
    the stage terms the replay used, the replay and how long it took."""
    strategy: Strategy
    training: TrainingSpec
    report: StrategyReport
    terms: list[StageTerms]
    simulation: SimulationResult
    simulate_s: float
    generated: str | None  # the line saying which orders were generated, if any


def simulate_strategy(problem: PlanningProblem, strategy: Strategy, source: str, *, cost_model: str = "full",
                      alpha_given: bool = False, transfers: bool = True,
                      keep_timeline: bool = False) -> SimulatedStrategy:
    """Score `strategy` on `problem` with the cost model and replay its schedule (its explicit orders, or
    the ones its schedule generates), with the boundaries between sites at their inter-site links under
    the full cost model."""
    training = training_for(strategy, problem.training)
    if not alpha_given:
        training = dataclasses.replace(training, alpha=schedule_named(strategy.schedule).alpha)
    profiles = problem.profiles(training)
    report = evaluate_strategy(strategy, problem.cluster, problem.model, training, profiles, source=source,
                               cost_model=cost_model)
    terms = report.terms
    if cost_model == "full":
        terms, _ = site_terms(strategy, problem.cluster, terms, problem.model, training, source)
    strategy, generated = with_schedule_orders(strategy, problem.cluster, None, source, profiles)
    schedule = run_schedule(strategy, None, source)
    started = time.perf_counter()
    simulation = simulate(schedule, terms, transfers=transfers, keep_timeline=keep_timeline)
    return SimulatedStrategy(strategy, training, report, terms, simulation, time.perf_counter() - started, generated)
