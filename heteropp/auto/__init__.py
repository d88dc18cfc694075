"""HeteroAuto: the strategy search over a heterogeneous cluster, its cost and memory models,
profiles, the event-driven pipeline simulator and the `heteroauto` CLI (docs/heteroauto.md).

Modules: specs (cluster, training), profiles (load, save, synthesise), profiler (measure through
torch), memory (per pipeline position), cost (the paper's model), sharding (layers per group),
search (DFS + two-stage), oracle (exhaustive), strategy (the file HeteroPP reads), evaluation,
simulator (replays heteropp.schedule action lists), cli.

Reasons about numbers only: must not import torch at module level (only `profiler`, used by
`heteroauto profile`, imports it, lazily).
"""
