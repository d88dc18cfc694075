"""JEEVES's stage division by its objective (HotNets '25, section 3.2), solved as a MILP with HiGHS.

The variables are the layers of each stage. The objective is the iteration time of an ideal schedule
under memory constraints, two parts summed:

- the ideal iteration time without memory constraints: the longer of the computation-dominant paths
  (through each stage s: the first micro-batch's forwards and hops up to s, all micro-batches'
  forward and backward on s, the last one's backwards and hops back down) and the
  communication-dominant paths (through each cross-site link, in each direction: every replica's
  every micro-batch crosses it at full bandwidth, plus the first micro-batch's way to it and the last
  one's way on); the same paths as heteroauto.simulator.critical_path_bounds, without updates;
- the extra time from memory constraints, on the stage where it is largest: a stage of l layers holds
  k = min(M, floor(budget / l)) micro-batches; its first forward beyond k waits for the earliest memory
  release, the first micro-batch's round trip from the stage's forward to its backward (RT; a message on a
  cross-site link waits its turn behind the other replicas' messages: R x occupancy + latency), where an
  ideal schedule would start it k periods P after the first (P: the pipeline's period per
  micro-batch, the slowest stage's forward + backward or a cross-site link's R x occupancy, whichever
  is longer); that delay max(0, RT - k P) recurs every k micro-batches: ceil(M / k) - 1 times.

MILP: one binary per (stage, layer count) picks each stage's layers (k and the recurrence count are
then constants), auxiliary variables take the maxima (T >= every path; the period P exactly the
largest of its terms through one binary per term; each stage's extra time >= its delay when its layer
count is picked, big-M otherwise). `estimate_s` evaluates the same objective for any division, so a
test can check the MILP's optimum against every division of small instances.

Pure Python plus highspy; must not import the runtime or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from h2.core.errors import UserError


@dataclass(frozen=True)
class DivisionProblem:
    """One replica's pipeline per micro-batch: a layer's forward seconds (the same on every stage), the
    backward/forward ratio, per boundary a message's occupancy and latency and whether the link is shared
    by all replicas (crosses sites); the activation budget in layer units (one layer of one micro-batch)."""
    num_layers: int
    num_stages: int
    layer_forward_s: float
    backward_factor: float
    occupancy_s: tuple[float, ...]
    latency_s: tuple[float, ...]
    shared: tuple[bool, ...]
    micro_batches: int
    replicas: int
    budget_layer_units: float

    def check(self) -> None:
        if self.num_stages < 1 or self.num_layers < self.num_stages:
            raise UserError(f"division: {self.num_layers} layers cannot fill {self.num_stages} stages")
        for name in ("occupancy_s", "latency_s", "shared"):
            if len(getattr(self, name)) != self.num_stages - 1:
                raise UserError(f"division: {name} needs one value per stage boundary ({self.num_stages - 1})")
        if self.held(1) < 1:
            raise UserError(f"division: the activation budget ({self.budget_layer_units:g} layer units) is below "
                            f"one micro-batch of a one-layer stage")
        if self.budget_layer_units < math.ceil(self.num_layers / self.num_stages):
            raise UserError(f"division: no division fits the activation budget ({self.budget_layer_units:g} layer "
                            f"units): one micro-batch of {self.num_layers} layers over {self.num_stages} stages "
                            f"needs {math.ceil(self.num_layers / self.num_stages)} on some stage")

    def held(self, layers: int) -> int:
        """k: the micro-batches a stage of `layers` layers holds within the budget (at most all of them)."""
        fit = self.budget_layer_units / layers
        return self.micro_batches if fit >= self.micro_batches else int(fit)

    def recurrences(self, layers: int) -> int:
        """How often a stage of `layers` layers waits for a memory release in one iteration."""
        return math.ceil(self.micro_batches / self.held(layers)) - 1

    def hop_s(self, boundary: int) -> float:
        """One message alone on its link."""
        return self.occupancy_s[boundary] + self.latency_s[boundary]

    def turn_s(self, boundary: int) -> float:
        """One message in the steady state: on a shared link it waits for every other replica's message
        of its period (the global send list alternates replicas), then crosses."""
        replicas = self.replicas if self.shared[boundary] else 1
        return replicas * self.occupancy_s[boundary] + self.latency_s[boundary]


# A linear form over the layers per stage: (coefficient per stage, constant).
Linear = tuple[tuple[float, ...], float]


def _paths(p: DivisionProblem) -> list[Linear]:
    """The ideal schedule's critical paths, each linear in the layers per stage."""
    a, beta, m, stages = p.layer_forward_s, p.backward_factor, p.micro_batches, p.num_stages
    paths: list[Linear] = []
    for s in range(stages):  # computation-dominant through stage s
        coeffs = [(1 + beta) * a if j < s else 0.0 for j in range(stages)]
        coeffs[s] = m * (1 + beta) * a
        paths.append((tuple(coeffs), 2 * sum(p.hop_s(j) for j in range(s))))
    for b in range(stages - 1):  # communication-dominant through each shared link
        if not p.shared[b]:
            continue
        carried = p.replicas * m * p.occupancy_s[b] + p.latency_s[b]
        hops_below = sum(p.hop_s(j) for j in range(b))
        hops_above = sum(p.hop_s(j) for j in range(b + 1, stages - 1))
        # either direction: the first micro-batch's way to the link, every message crossing it, the last
        # one's way on (both come to every layer's forward and backward and the same hops)
        paths.append((tuple((1 + beta) * a
                            for _ in range(stages)), 2 * hops_below + carried + 2 * hops_above + p.hop_s(b)))
    return paths


def _round_trip(p: DivisionProblem, s: int) -> Linear:
    """From a micro-batch's forward start on stage s to its backward end there, nothing queued."""
    coeffs = tuple((1 + p.backward_factor) * p.layer_forward_s if j >= s else 0.0 for j in range(p.num_stages))
    return coeffs, 2 * sum(p.turn_s(j) for j in range(s, p.num_stages - 1))


def _period_terms(p: DivisionProblem) -> list[Linear]:
    """The candidates for the pipeline's period per micro-batch: each stage's forward + backward, each
    shared link's replicas x occupancy."""
    stages = p.num_stages
    terms: list[Linear] = [(tuple((1 + p.backward_factor) * p.layer_forward_s if j == s else 0.0
                                  for j in range(stages)), 0.0) for s in range(stages)]
    terms += [((0.0, ) * stages, p.replicas * p.occupancy_s[b]) for b in range(stages - 1) if p.shared[b]]
    return terms


def _value(form: Linear, layers: tuple[int, ...]) -> float:
    return sum(c * l for c, l in zip(form[0], layers)) + form[1]


@dataclass(frozen=True)
class Estimate:
    layers: tuple[int, ...]
    ideal_s: float  # without memory constraints
    memory_delay_s: float  # the largest stage's extra time from memory constraints

    @property
    def iteration_s(self) -> float:
        return self.ideal_s + self.memory_delay_s


def estimate(p: DivisionProblem, layers: tuple[int, ...]) -> Estimate:
    """The objective (module doc) for one division."""
    if len(layers) != p.num_stages or sum(layers) != p.num_layers or min(layers) < 1:
        raise UserError(f"division: {list(layers)} is not a division of {p.num_layers} layers into "
                        f"{p.num_stages} stages")
    ideal = max(_value(path, layers) for path in _paths(p))
    period = max(_value(term, layers) for term in _period_terms(p))
    delays = [
        p.recurrences(l) * max(0.0,
                               _value(_round_trip(p, s), layers) - p.held(l) * period) for s, l in enumerate(layers)
    ]
    return Estimate(tuple(layers), ideal, max(delays))


def _layer_choices(p: DivisionProblem) -> range:
    return range(1, p.num_layers - p.num_stages + 2)


def solve(p: DivisionProblem, time_limit_s: float = 60.0) -> Estimate:
    """The division minimising the objective, by HiGHS on the MILP of the module doc."""
    import highspy

    p.check()
    stages, choices = p.num_stages, _layer_choices(p)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("time_limit", time_limit_s)
    pick = {(s, l): h.addBinary() for s in range(stages) for l in choices}
    layers = [sum(l * pick[(s, l)] for l in choices) for s in range(stages)]
    for s in range(stages):
        h.addConstr(sum(pick[(s, l)] for l in choices) == 1)
    h.addConstr(sum(layers) == p.num_layers)

    def linear(form: Linear):
        return sum(c * layers[j] for j, c in enumerate(form[0]) if c) + form[1]

    longest_path = max(_value(form, (p.num_layers, ) * stages) for form in _paths(p))  # a bound on every term
    ideal = h.addVariable(lb=0.0)
    for path in _paths(p):
        h.addConstr(ideal >= linear(path))
    terms = _period_terms(p)
    big_period = max(_value(t, (p.num_layers, ) * stages) for t in terms)
    period = h.addVariable(lb=0.0)
    is_max = [h.addBinary() for _ in terms]
    h.addConstr(sum(is_max) == 1)
    for term, chosen in zip(terms, is_max):
        h.addConstr(period >= linear(term))
        h.addConstr(period <= linear(term) + big_period * (1 - chosen))
    delay = h.addVariable(lb=0.0)
    for s in range(stages):
        round_trip = linear(_round_trip(p, s))
        for l in choices:
            times = p.recurrences(l) if p.budget_layer_units >= l else 0
            if p.budget_layer_units < l:
                h.addConstr(pick[(s, l)] == 0)  # not even one micro-batch fits
            elif times > 0:
                big = times * (longest_path + big_period * p.held(l))
                h.addConstr(delay >= times * (round_trip - p.held(l) * period) - big * (1 - pick[(s, l)]))
    h.minimize(ideal + delay)
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise UserError(f"division: HiGHS found no optimal division ({h.modelStatusToString(status)})")
    values = h.getSolution().col_value
    chosen_layers = tuple(next(l for l in choices if values[pick[(s, l)].index] > 0.5) for s in range(stages))
    return estimate(p, chosen_layers)


def exhaustive(p: DivisionProblem) -> Estimate:
    """The best division by trying every one (small instances: the tests' check of `solve`)."""
    p.check()
    best: Estimate | None = None

    def divisions(left: int, stages: int):
        if stages == 1:
            yield (left, )
            return
        for first in range(1, left - stages + 2):
            for rest in divisions(left - first, stages - 1):
                yield (first, ) + rest

    for layers in divisions(p.num_layers, p.num_stages):
        if max(layers) > p.budget_layer_units:
            continue
        candidate = estimate(p, layers)
        if best is None or candidate.iteration_s < best.iteration_s - 1e-12:
            best = candidate
    if best is None:
        raise UserError("division: no division fits the activation budget")
    return best
