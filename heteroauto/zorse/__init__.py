"""The Zorse planner (docs/zorse_planner.md): pipeline groups of whatever GPUs share fast links, ZeRO-2 data
parallelism inside a group with rows per GPU in proportion to its speed, interleaved ministages and
host offload, chosen in two phases.

Modules: graph (the cluster's machines and the bandwidth graph between them), partition (phase 1:
the SPLIT min-k-cut of that graph, every k in one pass), costs (the latency model: start-up + steady
+ drain with ZeRO-2 gathers overlapped; the memory model: resident ministages, sharded state,
activations, offloaded bytes; and, without overlap, HeteroPP's runtime), planner (phase 2: group
order, layers and rows, the enumeration of micro-batch size, recompute, ministages and offload),
strategies (a plan as a strategy file and back), scoring (a plan as the shared simulator's action
lists and stage terms), baselines (the paper's TorchTitan-Het, HexiScale and Cephalo as planners priced
by the same models and simulator).

Reasons about numbers only: imports h2.core, networkx and the planner's own modules
(heteroauto); never torch, never the runtime (heteropp) or anything above.
"""
