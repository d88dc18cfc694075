"""A pipeline across sites (datacenters), simulated three ways: 1F1B with the replicas splitting the
cross-site link, JEEVES (heteroauto.jeeves: its generated schedule replayed with its global send lists,
on the memory-aware division when that is faster), and 1F1B in one site, against the critical-path
lower bounds. The scenario file (configs/xdc/*.yaml) gives the model, the pipeline, the chip's
achieved speed and activation memory, the sites of the stages and the links.

Pure Python; must not import the runtime or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from h2.core.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.core.errors import UserError
from h2.core.schedule import one_f_one_b
from heteroauto.division import division_for_wish
from heteroauto.jeeves import PipelineCosts, jeeves_schedule
from heteroauto.jeeves_division import DivisionProblem, solve
from heteroauto.simulator import CriticalPathBounds, critical_path_bounds, shared_links_of, simulate_replicas
from heteroauto.stage_terms import StageTerms


@dataclass(frozen=True)
class XdcModel:
    layers: int
    hidden_size: int
    seq_len: int
    activation_bytes: float  # bytes per element of the activation sent between stages


@dataclass(frozen=True)
class XdcPipeline:
    stages: int
    tensor_parallel: int
    replicas: int
    micro_batches: int  # per replica per iteration
    micro_batch_size: int


@dataclass(frozen=True)
class XdcChip:
    name: str
    achieved_tflops: float  # per chip, on a decoder layer
    backward_factor: float  # backward time / forward time
    activation_gb_per_layer: float  # one layer's stored activations of one micro-batch, per chip
    activation_budget_gb: float  # what one chip has left for activations


@dataclass(frozen=True)
class XdcLink:
    bandwidth_gbps: float  # GB/s (10^9 bytes/s)
    latency_us: float


@dataclass(frozen=True)
class XdcSite:
    name: str
    stages: list[int]


@dataclass(frozen=True)
class XdcLinks:
    intra_site: XdcLink  # per replica between two stages of one site (all its TP lanes)
    inter_site: XdcLink  # one link between two sites, shared by every replica


@dataclass(frozen=True)
class XdcScenario:
    model: XdcModel
    pipeline: XdcPipeline
    chip: XdcChip
    sites: list[XdcSite]
    links: XdcLinks
    source: str = field(default="scenario", compare=False)

    def with_limit(self, micro_batches: int) -> "XdcScenario":
        """The activation budget that holds `micro_batches` micro-batches on a stage of the uniform division."""
        if micro_batches < 1:
            raise UserError(f"{self.source}: the in-flight limit k must be >= 1 (one micro-batch), got {micro_batches}")
        layers = max(self.uniform_layers())
        budget = micro_batches * layers * self.chip.activation_gb_per_layer * (1 + 1e-9)
        return replace(self, chip=replace(self.chip, activation_budget_gb=budget))

    def with_link(self, *, latency_ms: float | None = None, bandwidth_gbps: float | None = None) -> "XdcScenario":
        inter = self.links.inter_site
        if latency_ms is not None:
            inter = replace(inter, latency_us=latency_ms * 1000.0)
        if bandwidth_gbps is not None:
            inter = replace(inter, bandwidth_gbps=bandwidth_gbps)
        scenario = replace(self, links=replace(self.links, inter_site=inter))
        scenario.check()
        return scenario

    def check(self) -> None:
        where = self.source
        for name in ("layers", "hidden_size", "seq_len"):
            _positive(getattr(self.model, name), f"{where}: model.{name}")
        _positive(self.model.activation_bytes, f"{where}: model.activation_bytes")
        for name in ("stages", "tensor_parallel", "replicas", "micro_batches", "micro_batch_size"):
            _positive(getattr(self.pipeline, name), f"{where}: pipeline.{name}")
        for name in ("achieved_tflops", "backward_factor", "activation_gb_per_layer", "activation_budget_gb"):
            _positive(getattr(self.chip, name), f"{where}: chip.{name}")
        for name in ("intra_site", "inter_site"):
            link = getattr(self.links, name)
            _positive(link.bandwidth_gbps, f"{where}: links.{name}.bandwidth_gbps")
            if not (link.latency_us >= 0 and math.isfinite(link.latency_us)):
                raise UserError(f"{where}: links.{name}.latency_us must be a number >= 0, got {link.latency_us}")
        if self.model.layers < self.pipeline.stages:
            raise UserError(f"{where}: model.layers ({self.model.layers}) is fewer than pipeline.stages "
                            f"({self.pipeline.stages})")
        placed = sorted(s for site in self.sites for s in site.stages)
        if placed != list(range(self.pipeline.stages)):
            raise UserError(f"{where}: sites: every stage 0..{self.pipeline.stages - 1} must sit in exactly one "
                            f"site, got stages {placed}")
        if self.limit_micro_batches(self.model.layers // self.pipeline.stages) < 1:
            raise UserError(f"{where}: chip.activation_budget_gb ({self.chip.activation_budget_gb:g}) is below one "
                            f"micro-batch of a {self.model.layers // self.pipeline.stages}-layer stage")

    def site_of(self, stage: int) -> str:
        return next(site.name for site in self.sites if stage in site.stages)

    def layer_forward_s(self) -> float:
        """One decoder layer's forward of one micro-batch on the stage's TP chips: 24 s h^2 + 4 s^2 h
        FLOPs per sequence (GPT-3's layer), at the chip's achieved rate."""
        s, h = self.model.seq_len, self.model.hidden_size
        flops = (24 * s * h * h + 4 * s * s * h) * self.pipeline.micro_batch_size
        return flops / (self.pipeline.tensor_parallel * self.chip.achieved_tflops * 1e12)

    def activation_bytes(self) -> float:
        """One micro-batch's s x b x h activation (or gradient) crossing a stage boundary."""
        model = self.model
        return model.seq_len * self.pipeline.micro_batch_size * model.hidden_size * model.activation_bytes

    def limit_micro_batches(self, layers: int) -> int:
        """k of a stage of `layers` layers: the micro-batches whose activations fit its budget (at most
        all of them)."""
        fit = self.chip.activation_budget_gb / (layers * self.chip.activation_gb_per_layer)
        return self.pipeline.micro_batches if fit >= self.pipeline.micro_batches else int(fit)

    def budget_layer_units(self) -> float:
        return self.chip.activation_budget_gb / self.chip.activation_gb_per_layer

    def costs(self, layers: tuple[int, ...], *, one_site: bool = False) -> PipelineCosts:
        forward = tuple(l * self.layer_forward_s() for l in layers)
        intra, inter = self.links.intra_site, self.links.inter_site
        shared = tuple(not one_site and self.site_of(b) != self.site_of(b + 1) for b in range(len(layers) - 1))
        nbytes = self.activation_bytes()
        return PipelineCosts(forward_s=forward, backward_s=tuple(f * self.chip.backward_factor for f in forward),
                             occupancy_s=tuple(nbytes / ((inter if s else intra).bandwidth_gbps * 1e9)
                                               for s in shared), latency_s=tuple(
                                                   (inter if s else intra).latency_us * 1e-6
                                                   for s in shared), shared=shared)

    def uniform_layers(self) -> tuple[int, ...]:
        base, extra = divmod(self.model.layers, self.pipeline.stages)
        return tuple(base + (1 if s < extra else 0) for s in range(self.pipeline.stages))


def _positive(value: float, where: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UserError(f"{where} must be a number > 0, got {value}")


def load_scenario(path: str) -> XdcScenario:
    scenario = dataclass_from_mapping(XdcScenario, load_yaml_mapping(path), path)
    scenario = replace(scenario, source=path)
    scenario.check()
    return scenario


@dataclass(frozen=True)
class ScheduleRun:
    name: str
    layers: tuple[int, ...]
    limits: list[int]
    iteration_s: float
    peak_in_flight: list[int]
    bounds: CriticalPathBounds

    fits: bool = True  # every stage's in-flight micro-batches fit its activation budget

    @property
    def peak_layer_units(self) -> int:
        """The most activations a stage holds, in layers x micro-batches."""
        return max(l * k for l, k in zip(self.layers, self.peak_in_flight))


def _terms(costs: PipelineCosts) -> list[StageTerms]:
    return [
        StageTerms(f, b, 0.0, 0.0, send_occupancy_s=o, send_latency_s=l)
        for f, b, o, l in zip(costs.forward_s, costs.backward_s, costs.occupancy_s + (0.0, ), costs.latency_s + (0.0, ))
    ]


def _bounds(scenario: XdcScenario, costs: PipelineCosts) -> CriticalPathBounds:
    return critical_path_bounds(_terms(costs), scenario.pipeline.micro_batches, replicas=scenario.pipeline.replicas,
                                shared_links=shared_links_of(costs))


def one_f_one_b_run(scenario: XdcScenario, *, one_site: bool = False) -> ScheduleRun:
    """1F1B on the uniform division; across sites the replicas split the cross-site link."""
    layers = scenario.uniform_layers()
    costs = scenario.costs(layers, one_site=one_site)
    p = scenario.pipeline
    stages = p.stages
    schedule = one_f_one_b(stages, p.micro_batches)
    limits = [scenario.limit_micro_batches(l) for l in layers]
    result = simulate_replicas([schedule] * (1 if one_site else p.replicas), _terms(costs),
                               shared_links=shared_links_of(costs))
    return ScheduleRun(
        "1f1b (one site)" if one_site else "1f1b", layers, limits, result.iteration_s, result.peak_in_flight,
        _bounds(scenario, costs), fits=all(held <= k for held, k in zip(result.peak_in_flight, limits)))


def jeeves_run(scenario: XdcScenario, layers: tuple[int, ...] | None = None, name: str = "jeeves", *,
               coordinated: bool = True) -> ScheduleRun:
    """JEEVES's generated schedule on `layers` (default uniform), each stage limited to the micro-batches
    its activation budget holds, replayed by the simulator with the schedule's global send lists; not
    `coordinated`: the paper's comm-aware schedule alone, every replica scheduled on its even share of
    the cross-site link (as 1F1B here)."""
    layers = layers or scenario.uniform_layers()
    costs = scenario.costs(layers)
    limits = [scenario.limit_micro_batches(l) for l in layers]
    p = scenario.pipeline
    if coordinated:
        generated = jeeves_schedule(costs, p.micro_batches, limits, replicas=p.replicas, source=scenario.source)
        result = simulate_replicas(generated.actions, _terms(costs), shared_links=shared_links_of(costs, generated))
    else:
        share = replace(
            costs, occupancy_s=tuple(o * p.replicas if shared else o
                                     for o, shared in zip(costs.occupancy_s, costs.shared)),
            shared=(False, ) * len(costs.shared))
        generated = jeeves_schedule(share, p.micro_batches, limits, source=scenario.source)
        result = simulate_replicas(generated.actions * p.replicas, _terms(costs), shared_links=shared_links_of(costs))
    return ScheduleRun(name, layers, limits, result.iteration_s, result.peak_in_flight, _bounds(scenario, costs))


def memory_aware_jeeves_run(scenario: XdcScenario) -> ScheduleRun:
    """JEEVES on the best of the uniform division and the memory-aware ones (JEEVES section 3.2's
    trade-off: fewer layers where a stage must hold more micro-batches, at the price of a slower
    slowest stage). The uniform run with no memory limit says how many micro-batches each stage would
    hold (its wish); for every cap on a stage's layers from the uniform one up to 1.5x, the exact DP
    (division_for_wish) gives the division that best meets the wishes within the budget; a candidate
    whose critical-path bound is below the best time so far is generated and simulated, the fastest
    kept (the bound prunes exactly: no schedule beats it)."""
    best = jeeves_run(scenario)
    if all(held < k for held, k in zip(best.peak_in_flight, best.limits)):
        return best  # no stage reached its limit: memory does not bind
    unlimited = replace(scenario, chip=replace(scenario.chip, activation_budget_gb=math.inf))
    wish = jeeves_run(unlimited).peak_in_flight
    uniform = max(scenario.uniform_layers())
    tried = {best.layers}
    for max_layers in range(uniform, uniform + uniform // 2 + 1):
        layers = division_for_wish(scenario.model.layers, wish, scenario.budget_layer_units(), max_layers)
        if layers is None or layers in tried:
            continue
        tried.add(layers)
        if _bounds(scenario, scenario.costs(layers)).bound_s >= best.iteration_s:
            continue
        candidate = jeeves_run(scenario, layers, name="jeeves (memory-aware division)")
        if candidate.iteration_s < best.iteration_s:
            best = candidate
    return best


def division_problem(scenario: XdcScenario) -> DivisionProblem:
    """The scenario as JEEVES's division problem (heteroauto.jeeves_division)."""
    costs = scenario.costs(scenario.uniform_layers())
    return DivisionProblem(num_layers=scenario.model.layers, num_stages=scenario.pipeline.stages,
                           layer_forward_s=scenario.layer_forward_s(), backward_factor=scenario.chip.backward_factor,
                           occupancy_s=costs.occupancy_s, latency_s=costs.latency_s, shared=costs.shared,
                           micro_batches=scenario.pipeline.micro_batches, replicas=scenario.pipeline.replicas,
                           budget_layer_units=scenario.budget_layer_units())


def solver_jeeves_run(scenario: XdcScenario) -> ScheduleRun:
    """JEEVES on the division that minimises the paper's objective (section 3.2, solved by HiGHS),
    generated and simulated like every other run."""
    solved = solve(division_problem(scenario))
    return jeeves_run(scenario, solved.layers, name="jeeves (solver division)")


@dataclass(frozen=True)
class CrossSiteReport:
    latency_ms: float
    bandwidth_gbps: float
    one_f_one_b: ScheduleRun
    uncoordinated: ScheduleRun  # JEEVES's rules on the uniform division, no global send list
    jeeves: ScheduleRun
    one_site: ScheduleRun
    # JEEVES given only the activation memory 1F1B uses (its peak in flight on a uniform stage), or None
    # when the scenario's own budget is already no larger
    jeeves_equal_memory: ScheduleRun | None = None
    jeeves_solver: ScheduleRun | None = None  # JEEVES on the division by the paper's objective, when asked

    @property
    def speedup(self) -> float:
        return self.one_f_one_b.iteration_s / self.jeeves.iteration_s

    @property
    def saving(self) -> float:
        """JEEVES against 1F1B, each with the scenario's activation budget (equal schedule budgets)."""
        return 1 - self.jeeves.iteration_s / self.one_f_one_b.iteration_s

    @property
    def equal_memory_run(self) -> ScheduleRun:
        return self.jeeves_equal_memory or self.jeeves

    @property
    def equal_memory_saving(self) -> float:
        """JEEVES held to the micro-batches 1F1B holds, against 1F1B."""
        return 1 - self.equal_memory_run.iteration_s / self.one_f_one_b.iteration_s

    def to_dict(self) -> dict:

        def run(r: ScheduleRun) -> dict:
            return {
                "schedule": r.name, "layers": list(r.layers), "limits": r.limits, "iteration_s": r.iteration_s,
                "peak_in_flight": r.peak_in_flight, "peak_layer_units": r.peak_layer_units, "fits": r.fits,
                "compute_bound_s": r.bounds.compute_s, "communication_bound_s": r.bounds.communication_s
            }

        return {
            "latency_ms": self.latency_ms, "bandwidth_gbps": self.bandwidth_gbps, "1f1b": run(
                self.one_f_one_b), "jeeves_uncoordinated": run(self.uncoordinated), "jeeves": run(
                    self.jeeves), "one_site": run(self.one_site), "jeeves_equal_memory": run(self.equal_memory_run),
            "jeeves_saves": self.saving, "jeeves_saves_at_equal_memory": self.equal_memory_saving,
            "jeeves_over_one_site": self.jeeves.iteration_s / self.one_site.iteration_s,
            "jeeves_solver_division": None if self.jeeves_solver is None else run(self.jeeves_solver)
        }


def equal_memory_jeeves_run(scenario: XdcScenario, one_f_one_b: ScheduleRun) -> ScheduleRun | None:
    """JEEVES (memory-aware) with the activation memory limited to what 1F1B holds at its peak: as many
    micro-batches of a uniform stage as 1F1B keeps in flight on its fullest stage. None when the
    scenario's own budget is no larger (then the equal-schedule run already is the equal-memory one)."""
    held = max(one_f_one_b.peak_in_flight)
    uniform = scenario.model.layers // scenario.pipeline.stages
    if scenario.limit_micro_batches(uniform) <= held:
        return None
    run = memory_aware_jeeves_run(scenario.with_limit(held))
    return replace(run, name=f"jeeves at 1f1b's memory (k={held})")


def compare(scenario: XdcScenario, *, memory_aware: bool = True, equal_memory: bool = True,
            solver_division: bool = False) -> CrossSiteReport:
    inter = scenario.links.inter_site
    one_f_one_b = one_f_one_b_run(scenario)
    return CrossSiteReport(
        latency_ms=inter.latency_us / 1000.0, bandwidth_gbps=inter.bandwidth_gbps, one_f_one_b=one_f_one_b,
        uncoordinated=jeeves_run(scenario, name="jeeves without the send list", coordinated=False),
        jeeves=memory_aware_jeeves_run(scenario) if memory_aware else jeeves_run(scenario), one_site=one_f_one_b_run(
            scenario, one_site=True), jeeves_equal_memory=equal_memory_jeeves_run(scenario, one_f_one_b)
        if equal_memory else None, jeeves_solver=solver_jeeves_run(scenario) if solver_division else None)
