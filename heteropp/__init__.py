"""HeteroPP: pipeline parallelism where each stage is one chip type with its own TP size,
layer count and recompute setting.

Owns: topology from a strategy, process groups, stage building, tensor parallelism,
schedules (as printable action lists), resharding between stages, DP and ZeRO-1.
`heteroauto` (HeteroAuto, the planner) is pure Python and never imports torch.
"""
