"""HeteroAuto: the strategy search over a heterogeneous cluster, its cost and memory models,
profiles, the event-driven pipeline simulator and the `heteroauto` CLI (docs/heteroauto.md).

Modules: profiles (load, save, synthesise, and built from the runtime's measurements), memory (per
pipeline position), cost (the paper's model), sharding (layers per group), search (DFS + two-stage),
oracle (exhaustive), evaluation, simulator (replays h2.core.schedule action lists, several replicas
sharing cross-site links, critical-path bounds), division (memory-aware layers per stage), cross_site
(1F1B, JEEVES and one site compared on a scenario file); the Zorse planner in the zorse package
(docs/zorse_planner.md). The cluster,
strategy and schedule formats are h2.core's; measuring a chip is the runtime's (heteropp.profiling).

Reasons about numbers only: imports h2.core and nothing else of the project (networkx for the Zorse
planner's min-cut), and never torch.
"""
