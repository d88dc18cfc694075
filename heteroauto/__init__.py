"""HeteroAuto: the strategy search over a heterogeneous cluster, its cost and memory models,
profiles, the event-driven pipeline simulator: the library of the `heteroauto` command (h2.cli.heteroauto,
docs/heteroauto.md).

Modules: problem (the planning problem of a loaded cluster: model, training with a command's overrides,
profile files), planning (search a strategy and score it, or replay a given one: what `heteroauto
search/simulate` and `h2 run/plan` call), profile_cache (where profile files live, which are up to date,
which chip types must be measured), predicted_trace (the simulated schedule as a Perfetto trace),
profiles (load, save, synthesise, and built from the runtime's measurements), memory (per
pipeline position), cost (the paper's model), sharding (layers per group), search (DFS + two-stage),
oracle (exhaustive), evaluation, simulator (replays h2.core.schedule action lists, several replicas
sharing cross-site links, critical-path bounds), division (memory-aware layers per stage), cross_site
(1F1B, JEEVES and one site compared on a scenario file); the Zorse planner in the zorse package
(docs/zorse_planner.md). The cluster,
strategy and schedule formats are h2.core's; measuring a chip is the runtime's (heteropp.profiling, run by
h2.launch.profiling_job).

The search's dynamic programmes (layer_dp, orders_dp) run in the C++ extension heteroauto._dp
(csrc/heteroauto, pybind11, no torch), which memory also uses for its caps' rounding; their numpy code
stays as the reference the tests compare it against.

Reasons about numbers only: imports h2.core and nothing else of the project (networkx for the Zorse
planner's min-cut), and never torch.
"""
