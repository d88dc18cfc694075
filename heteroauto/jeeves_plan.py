"""A JEEVES schedule for a strategy on a cluster: the generator's inputs from the planner's models,
and the per-stage orders it generates, ready for the strategy file the runtime runs.

- Costs per stage: forward and backward seconds per micro-batch and per boundary the transfer of one
  micro-batch's activation, from the cost model ("full": layers, embedding, head, transfers); a
  boundary between two sites is priced at the link between the two stages' ranks as placed
  (h2.core.links: occupancy at the link's bandwidth, then its latency) and is a shared link (all
  replicas' messages on one queue).
- In-flight limit k per stage: the strategy's `in_flight_limit`, else the most micro-batches whose
  activations fit in the stage's chip next to its weights and optimizer state (the memory model);
  a stage that cannot hold one is a one-line error.

With replicas sharing a cross-site link (every stage the same dp), the generator schedules all
replicas on one queue per shared boundary and direction: each replica gets its own orders
(`replica_orders`) and the link its global send lists (`send_lists`), which the runtime's pacing follows
(heteropp.p2p); otherwise every replica runs replica 0's orders.

Must not import the runtime; pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from h2.core.cluster import ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.links import rank_locations, stage_link, stage_site
from h2.core.model_config import ModelConfig
from h2.core.stage_orders import format_send_list, needs_generated_orders, orders_of
from h2.core.strategy import Strategy
from heteroauto.evaluation import evaluate_strategy, stage_layer_profile, training_for
from heteroauto.jeeves import JeevesSchedule, PipelineCosts, jeeves_schedule
from heteroauto.memory import stage_memory_terms_at
from heteroauto.profiles import Profile, profiles_for
from heteroauto.stage_terms import StageTerms, micro_batch_activation_bytes


@dataclass
class StrategyCosts:
    """A strategy priced on a cluster: each stage's terms with its sites' links, which boundaries join
    two sites, and what the memory model needs to find each stage's in-flight limit."""
    terms: list[StageTerms]
    shared: list[bool]  # per boundary: it joins two sites
    model: ModelConfig
    training: TrainingSpec
    profiles: dict[str, Profile]
    cluster: ClusterSpec
    source: str


def training_of(strategy: Strategy, cluster: ClusterSpec) -> TrainingSpec:
    """The training spec the strategy implies on `cluster` (its `training` section's byte sizes)."""
    model = strategy.model_config()
    base = cluster.training or TrainingSpec(seq_len=strategy.seq_len or model.max_seq_len, global_batch_sequences=1)
    return training_for(strategy, base)


def site_terms(strategy: Strategy, cluster: ClusterSpec, terms: list[StageTerms], model: ModelConfig,
               training: TrainingSpec, source: str = "strategy") -> tuple[list[StageTerms], list[bool]]:
    """`terms` (cost model "full") with each boundary between two sites priced at the link between
    its stages' ranks as placed (the inter_site class or the sites' pair), and which boundaries those are."""
    locations = rank_locations(strategy, cluster, source)
    terms, shared = list(terms), []
    activation = micro_batch_activation_bytes(model, training, strategy.micro_batch_sequences)
    for boundary in range(len(terms) - 1):
        crosses = stage_site(strategy, cluster, boundary, source) != stage_site(strategy, cluster, boundary + 1, source)
        shared.append(crosses)
        if crosses:
            link = stage_link(strategy, cluster, locations, boundary, boundary + 1)
            lanes = min(strategy.stages[index].tp * strategy.stage_dp(index) for index in (boundary, boundary + 1))
            terms[boundary] = dataclasses.replace(terms[boundary], send_occupancy_s=activation / lanes /
                                                  link.bytes_per_s, send_latency_s=link.latency_s)
    return terms, shared


def strategy_costs(strategy: Strategy, cluster: ClusterSpec, source: str = "strategy",
                   profiles: dict[str, Profile] | None = None) -> StrategyCosts:
    """Price `strategy` on `cluster` (profiles synthesised from the chip types where not given)."""
    model, training = strategy.model_config(source), training_of(strategy, cluster)
    profiles = profiles or profiles_for(cluster, model, training)
    report = evaluate_strategy(strategy, cluster, model, training, profiles, source=source)
    terms, shared = site_terms(strategy, cluster, report.terms, model, training, source)
    return StrategyCosts(terms, shared, model, training, profiles, cluster, source)


def memory_limits(strategy: Strategy, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec,
                  profiles: dict[str, Profile], source: str = "strategy") -> list[int]:
    """Per stage, the most micro-batches (at most the step's) whose activations its chip holds."""
    last = len(strategy.stages) - 1
    limits = []
    for index, stage in enumerate(strategy.stages):
        layer = stage_layer_profile(strategy, profiles, index)
        stage_training = dataclasses.replace(training, micro_batch_size=strategy.stage_micro_batch_size(index))
        capacity = cluster.chip(stage.chip).capacity_bytes

        def needs(in_flight: int) -> float:
            return stage_memory_terms_at(model, stage_training, layer, dp=strategy.stage_dp(index),
                                         recompute=stage.recompute, in_flight=in_flight, first=index == 0,
                                         last=index == last).bytes(stage.layers)

        if needs(1) > capacity:
            raise UserError(f"{source}: field 'stages[{index}]': chip '{stage.chip}' holds {capacity / 1e9:.4g} GB, "
                            f"one micro-batch in flight over its {stage.layers} layers needs {needs(1) / 1e9:.4g} GB: "
                            f"its in-flight limit would be below one micro-batch")
        k = 1
        while k < strategy.micro_batches and needs(k + 1) <= capacity:
            k += 1
        limits.append(k)
    return limits


def in_flight_limits(strategy: Strategy, costs: StrategyCosts) -> list[int]:
    """k per stage: the strategy's `in_flight_limit` where it sets one, else the memory model's."""
    if strategy.in_flight_limit is not None:
        return [strategy.in_flight_limit] * len(strategy.stages)
    return memory_limits(strategy, costs.cluster, costs.model, costs.training, costs.profiles, costs.source)


def generate_jeeves(strategy: Strategy, costs: StrategyCosts,
                    source: str = "strategy") -> tuple[Strategy, JeevesSchedule]:
    """`strategy` with schedule jeeves and the generated per-stage orders, and the generator's result."""
    terms = costs.terms
    pipeline = PipelineCosts(forward_s=tuple(t.forward_s for t in terms), backward_s=tuple(t.backward_s for t in terms),
                             occupancy_s=tuple(t.send_occupancy_s for t in terms[:-1]), latency_s=tuple(
                                 t.send_latency_s for t in terms[:-1]), shared=tuple(costs.shared))
    replicas = shared_replicas(strategy, costs)
    generated = jeeves_schedule(pipeline, strategy.micro_batches, in_flight_limits(strategy, costs), replicas=replicas,
                                source=source)
    orders = orders_of(generated.actions[0])
    if replicas == 1:
        return dataclasses.replace(strategy, schedule="jeeves", orders=orders, replica_orders=None,
                                   send_lists=None), generated
    send_lists = [
        format_send_list(boundary, direction, [(m.replica, m.micro_batch) for m in messages])
        for (boundary, direction), messages in sorted(generated.send_lists.items())
    ]
    return dataclasses.replace(strategy, schedule="jeeves", orders=orders, replica_orders=[
        orders_of(actions) for actions in generated.actions
    ], send_lists=send_lists), generated


def shared_replicas(strategy: Strategy, costs: StrategyCosts) -> int:
    """How many replicas share each cross-site link: the strategy's dp when every stage has it and some
    boundary crosses sites (then every replica runs its own order and the link takes one global send
    list); else 1 (every replica runs replica 0's order)."""
    dps = {strategy.stage_dp(index) for index in range(len(strategy.stages))}
    return dps.pop() if len(dps) == 1 and any(costs.shared) else 1


def with_schedule_orders(strategy: Strategy, cluster: ClusterSpec, schedule: str | None, source: str,
                         profiles: dict | None = None) -> tuple[Strategy, str | None]:
    """The strategy with the orders its stages run and a line describing them: JEEVES's, generated from
    the cluster's costs (on `profiles`, else synthesised ones), sites and memory, when `schedule`
    (--schedule, else the strategy's) is jeeves and the strategy carries no jeeves orders of its own;
    else the strategy as it is and None."""
    if not needs_generated_orders(strategy, schedule, source):
        return strategy, None
    costs = strategy_costs(strategy, cluster, source, profiles)
    strategy, generated = generate_jeeves(strategy, costs, source)
    return strategy, (f"schedule jeeves generated for cluster {cluster.source}: in-flight limits "
                      f"k={in_flight_limits(strategy, costs)}, peak in flight {generated.peak_in_flight}; "
                      f"orders: " + " | ".join(strategy.orders) + _replica_lines(strategy))


def _replica_lines(strategy: Strategy) -> str:
    if strategy.replica_orders is None:
        return ""
    others = "; ".join(f"replica {r}: " + " | ".join(orders) for r, orders in enumerate(strategy.replica_orders) if r)
    return f"; {others}; global send lists: " + "; ".join(strategy.send_lists or [])


def predicted_iteration_s(strategy: Strategy, costs: StrategyCosts, schedule: str | None = None,
                          source: str = "strategy") -> float:
    """The simulator's step of `strategy` as its ranks run it (its orders for `schedule`, each replica's
    own where it has replica_orders): every replica replayed, each cross-site boundary one queue that
    all replicas share, in the strategy's global send lists where it has them (else the replicas'
    messages split the link)."""
    from h2.core.stage_orders import parse_send_lists, run_schedule
    from heteroauto.jeeves import Message
    from heteroauto.simulator import SharedLink, simulate_replicas

    replicas = shared_replicas(strategy, costs)
    schedules = [
        run_schedule(strategy, schedule, source, replica if strategy.replica_orders else 0)
        for replica in range(replicas)
    ]
    lists = {}
    if strategy.send_lists is not None and strategy.replica_orders is not None:
        lists = parse_send_lists(strategy.send_lists, len(strategy.stages), replicas, strategy.micro_batches, source)
    shared = {}
    for boundary, crosses in enumerate(costs.shared):
        if crosses and replicas > 1:
            orders = {d: [Message(r, m) for r, m in lists[(boundary, d)]] for d in "FB"} if lists else None
            term = costs.terms[boundary]
            shared[boundary] = SharedLink(term.send_occupancy_s, term.send_latency_s, orders)
    return simulate_replicas(schedules, costs.terms, shared_links=shared).iteration_s
