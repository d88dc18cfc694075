"""The outer loop at the paper's scale, simulated: clusters of given throughput push, wait for the
window, the shards update, the participants pull; it reports the PS's overhead per round.

A scenario (configs/dips/paper-table1.yaml) names the clusters (peak PFLOPS, how many workers talk to
the PS at once), the inter-site bandwidth matrix B (Gbps, B[i][j]: CPU servers at site i to cluster
j), the model size, the shards and their update rate. The PS is placed at argmax_i B_iᵀ p (p: the
clusters' training throughputs, Di-PS section 3.1). Per cluster: step time = tokens_per_step *
6 * parameters / (PFLOPS * mfu); a push moves the model's bytes at min(link * workers, the shards'
ingress shared by every transfer in flight); the update takes bytes / (shards * update_gbps); a pull
is a push backwards. Events are processed in time order (Algorithm 1's window: every commit re-arms
it). Nothing here runs a model: it is arithmetic on the scenario's numbers.

The run file's modes (h2.core.dips.MODE_RULES) close rounds the same way here: `dips` and `async-diloco`
grace_s after the last arrival, `async` at once, `sync` once every cluster has committed. In `async-diloco`
(asynchronous DiLoCo on a decentralized architecture) there is no PS: a round's clusters all-reduce their
pseudo-gradients among themselves (a ring: each link carries 2 (n - 1) / n of the model, at the slowest
link of the ring between the members' sites, B[i][j] x the fewer workers), and each applies its own outer
step (not timed: it runs on the cluster's own accelerators); a cluster alone in its round exchanges nothing.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
import statistics
from dataclasses import dataclass, field

from h2.core.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.core.dips import MODE_RULES, MODES
from h2.core.errors import UserError
from h2.ps.placement import best_site


@dataclass
class SiteCluster:
    name: str
    pflops: float
    workers: int = 1  # pipeline stages that push and pull in parallel


@dataclass
class Scenario:
    parameters: float
    clusters: list[SiteCluster]
    bandwidth_gbps: list[list[float]]
    bytes_per_parameter: int = 4
    tokens_per_step: int = 4_194_304
    mfu: float = 0.4
    inner_steps: int = 64
    shards: int = 16
    shard_nic_gbps: float = 25.0
    update_gbps: float = 2.0  # bytes of model a shard's CPU optimizer updates per second (Gbit/s)
    grace_s: float = 60.0

    @property
    def model_bytes(self) -> float:
        return self.parameters * self.bytes_per_parameter

    def step_s(self, cluster: SiteCluster) -> float:
        return self.tokens_per_step * 6 * self.parameters / (cluster.pflops * 1e15 * self.mfu)


def load_scenario(path: str) -> Scenario:
    scenario = dataclass_from_mapping(Scenario, load_yaml_mapping(path), path)
    n = len(scenario.clusters)
    if n == 0:
        raise UserError(f"{path}: field 'clusters' is empty")
    if len(scenario.bandwidth_gbps) != n or any(len(row) != n for row in scenario.bandwidth_gbps):
        raise UserError(f"{path}: field 'bandwidth_gbps' must be {n} x {n} (one row and column per cluster)")
    for name in ("parameters", "mfu", "shards", "shard_nic_gbps", "update_gbps", "inner_steps", "tokens_per_step"):
        if getattr(scenario, name) <= 0:
            raise UserError(f"{path}: field '{name}' must be positive, got {getattr(scenario, name)}")
    return scenario


def placement(scenario: Scenario) -> int:
    """argmax_i of B_iᵀ p (h2.ps.placement): p the clusters' throughputs, 1 / step time."""
    return best_site(scenario.bandwidth_gbps, [1.0 / scenario.step_s(c) for c in scenario.clusters])


@dataclass
class RoundReport:
    round: int
    participants: list[str]
    push_s: dict[str, float]
    update_s: float
    pull_s: dict[str, float]


@dataclass
class ClusterReport:
    name: str
    step_s: float
    rounds: int = 0
    compute_s: float = 0.0
    push_s: float = 0.0
    wait_s: float = 0.0
    pull_s: float = 0.0

    @property
    def overhead(self) -> float:
        spent = self.compute_s + self.push_s + self.wait_s + self.pull_s
        return (self.push_s + self.wait_s + self.pull_s) / spent if spent else 0.0


@dataclass
class Simulation:
    site: int
    mode: str = "dips"
    rounds: list[RoundReport] = field(default_factory=list)
    clusters: dict[str, ClusterReport] = field(default_factory=dict)


def _transfer_s(scenario: Scenario, cluster_index: int, site: int, concurrent: int) -> float:
    cluster = scenario.clusters[cluster_index]
    link = scenario.bandwidth_gbps[site][cluster_index] * cluster.workers
    shard_share = scenario.shards * scenario.shard_nic_gbps / max(1, concurrent)
    return scenario.model_bytes * 8 / (min(link, shard_share) * 1e9)


def _allreduce_s(scenario: Scenario, members: list[int]) -> float:
    """A ring all-reduce of the model among `members` (cluster indices, the ring in that order)."""
    if len(members) < 2:
        return 0.0
    ring = zip(members, members[1:] + members[:1])
    slowest = min(scenario.bandwidth_gbps[i][j] * min(scenario.clusters[i].workers, scenario.clusters[j].workers)
                  for i, j in ring)
    return 2 * (len(members) - 1) / len(members) * scenario.model_bytes * 8 / (slowest * 1e9)


def simulate(scenario: Scenario, rounds: int = 20, mode: str = "dips") -> Simulation:
    if mode not in MODES:
        raise UserError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    rules = MODE_RULES[mode]
    site = placement(scenario)
    sim = Simulation(site, mode,
                     clusters={c.name: ClusterReport(c.name, scenario.step_s(c)) for c in scenario.clusters})
    update_s = scenario.model_bytes * 8 / (scenario.shards * scenario.update_gbps * 1e9)
    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, cluster index)
    order = 0
    for index, cluster in enumerate(scenario.clusters):
        compute = scenario.inner_steps * scenario.step_s(cluster)
        sim.clusters[cluster.name].compute_s += compute
        heapq.heappush(events, (compute, order := order + 1, "computed", index))
    in_flight, pending, window_closes, busy_until = 0, [], None, 0.0
    pushed_at: dict[int, float] = {}
    while events and len(sim.rounds) < rounds:
        now, _, kind, index = heapq.heappop(events)
        name = scenario.clusters[index].name
        if kind == "computed":
            in_flight += 1
            push = 0.0 if rules.decentralized else _transfer_s(scenario, index, site, in_flight)
            sim.clusters[name].push_s += push
            pushed_at[index] = now
            heapq.heappush(events, (now + push, order := order + 1, "committed", index))
        elif kind == "committed":
            in_flight -= 1
            pending.append((index, now - pushed_at[index]))
            if rules.round_closes != "all" or len(pending) == len(scenario.clusters):
                window_closes = now + (scenario.grace_s if rules.round_closes == "window" else 0.0)
                heapq.heappush(events, (window_closes, order := order + 1, "window", -1))
        elif kind == "window" and pending and window_closes is not None and now >= window_closes and (
                rules.decentralized):
            batch, pending, window_closes = pending, [], None
            members = [member for member, _ in batch]
            exchange = _allreduce_s(scenario, members)
            for member in members:
                report = sim.clusters[scenario.clusters[member].name]
                report.wait_s += now - pushed_at[member]
                report.push_s += exchange
                report.rounds += 1
                compute = scenario.inner_steps * scenario.step_s(scenario.clusters[member])
                report.compute_s += compute
                heapq.heappush(events, (now + exchange + compute, order := order + 1, "computed", member))
            names = [scenario.clusters[m].name for m in members]
            sim.rounds.append(
                RoundReport(len(sim.rounds) + 1, names, {n: exchange for n in names}, 0.0, {n: 0.0 for n in names}))
        elif kind == "window" and pending and window_closes is not None and now >= window_closes:
            start = max(now, busy_until)
            busy_until = start + update_s
            batch, pending, window_closes = pending, [], None
            pulls = {}
            for member, push in batch:
                member_name = scenario.clusters[member].name
                pull = _transfer_s(scenario, member, site, len(batch))
                pulls[member_name] = pull
                report = sim.clusters[member_name]
                report.wait_s += busy_until - (pushed_at[member] + push)
                report.pull_s += pull
                report.rounds += 1
                compute = scenario.inner_steps * scenario.step_s(scenario.clusters[member])
                report.compute_s += compute
                heapq.heappush(events, (busy_until + pull + compute, order := order + 1, "computed", member))
            sim.rounds.append(
                RoundReport(
                    len(sim.rounds) + 1, [scenario.clusters[m].name
                                          for m, _ in batch], {scenario.clusters[m].name: p
                                                               for m, p in batch}, update_s, pulls))
    return sim


def report(scenario: Scenario, sim: Simulation) -> str:
    gb = scenario.model_bytes / 1e9
    where = ("no PS: each round's clusters all-reduce their pseudo-gradients (ring; 'push s' is the all-reduce) "
             "and step their own outer optimizers" if MODE_RULES[sim.mode].decentralized else
             f"{scenario.shards} shards x {scenario.shard_nic_gbps:g} Gbps; PS placed at "
             f"{scenario.clusters[sim.site].name}'s site (argmax of B_i^T p)")
    lines = [
        f"mode {sim.mode}; model {scenario.parameters / 1e9:.0f} B parameters = {gb:.0f} GB per push and per pull; "
        f"H = {scenario.inner_steps}; {where}",
        f"{'round':>5}  {'participants':<28}{'push s (max)':>13}{'update s':>10}{'pull s (max)':>13}"
    ]
    for r in sim.rounds:
        lines.append(f"{r.round:>5}  {', '.join(r.participants):<28}{max(r.push_s.values()):>13.0f}"
                     f"{r.update_s:>10.0f}{max(r.pull_s.values()):>13.0f}")
    lines.append(f"{'cluster':<9}{'step s':>8}{'rounds':>8}{'push s':>9}{'wait s':>9}{'pull s':>9}{'overhead':>10}")
    for c in sim.clusters.values():
        n = max(c.rounds, 1)
        lines.append(f"{c.name:<9}{c.step_s:>8.1f}{c.rounds:>8}{c.push_s / n:>9.0f}{c.wait_s / n:>9.0f}"
                     f"{c.pull_s / n:>9.0f}{100 * c.overhead:>9.1f}%")
    total = sum(c.push_s + c.wait_s + c.pull_s for c in sim.clusters.values())
    spent = total + sum(c.compute_s for c in sim.clusters.values())
    what = "The all-reduces' and windows'" if MODE_RULES[sim.mode].decentralized else "PS"
    lines.append(f"{what} overhead over all clusters: {100 * total / spent:.1f}% of their time (simulated)")
    return "\n".join(lines)


@dataclass
class MeasuredUpdate:
    """A run's measured update rate: what its shards' outer optimizers updated per second."""
    source: str
    rounds: int
    median_update_s: float
    model_bytes: int
    shards: int

    @property
    def gbps_per_shard(self) -> float:
        return self.model_bytes * 8 / (self.shards * self.median_update_s * 1e9)


def measured_update(run_dir: str) -> MeasuredUpdate:
    """The median update time of a run's rounds (`<run>/rounds.jsonl`: update_s, bytes_pushed per participant,
    the master's shards) as a rate per shard, for the simulator's `update_gbps`."""
    path = os.path.join(run_dir, "rounds.jsonl")
    if not os.path.exists(path):
        raise UserError(f"--update-from {run_dir}: no rounds.jsonl (a folder `h2 ps launch` wrote)")
    with open(path, encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    starts = [e["shards"] for e in events if e["event"] == "start" and "shards" in e]
    registered = {e["shard"] for e in events if e["event"] == "shard"}  # runs whose start event names no shards
    shards = starts[-1] if starts else len(registered)
    rounds = [e for e in events if e["event"] == "round" and e.get("update_s", 0) > 0 and e["participants"]]
    if not shards or not rounds:
        raise UserError(f"{path}: no measured round updates (or no shard on record)")
    model_bytes = rounds[0]["bytes_pushed"] // len(rounds[0]["participants"])
    update_s = statistics.median(e["update_s"] for e in rounds)
    return MeasuredUpdate(path, len(rounds), update_s, model_bytes, shards)


def with_update_rate(scenario: Scenario, gbps_per_shard: float) -> Scenario:
    return dataclasses.replace(scenario, update_gbps=gbps_per_shard)


@dataclass
class ScalingPoint:
    clusters: list[str]
    site: int
    ideal_tokens_per_s: float  # the clusters trained independently, no PS
    tokens_per_s: float  # through the PS (compute time over all time, per cluster)

    @property
    def percent_of_ideal(self) -> float:
        return 100.0 * self.tokens_per_s / self.ideal_tokens_per_s


def subset(scenario: Scenario, indices: list[int]) -> Scenario:
    """The scenario restricted to some of its clusters (their rows and columns of B)."""
    return dataclasses.replace(scenario, clusters=[scenario.clusters[i] for i in indices],
                               bandwidth_gbps=[[scenario.bandwidth_gbps[i][j] for j in indices] for i in indices])


def weak_scaling(scenario: Scenario, up_to: int, rounds_per_cluster: int = 20) -> list[ScalingPoint]:
    """Clusters added in descending speed (1, 2, ... up_to of them); each set simulated for
    rounds_per_cluster x its size rounds; its token rate against the clusters' independent rate."""
    order = sorted(range(len(scenario.clusters)), key=lambda i: -scenario.clusters[i].pflops)
    points = []
    for n in range(1, min(up_to, len(order)) + 1):
        part = subset(scenario, order[:n])
        sim = simulate(part, rounds=rounds_per_cluster * n)
        ideal = sum(part.tokens_per_step / part.step_s(c) for c in part.clusters)
        achieved = sum(part.tokens_per_step / part.step_s(c) * (1.0 - sim.clusters[c.name].overhead)
                       for c in part.clusters)
        points.append(ScalingPoint([c.name for c in part.clusters], sim.site, ideal, achieved))
    return points
