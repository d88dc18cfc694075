"""HeteroPP: pipeline parallelism where each stage is one chip type with its own TP size,
layer count and recompute setting.

Owns: topology from a strategy, process groups, stage building, tensor parallelism, the executors
of a schedule's action lists (the schedules themselves are h2.core.schedule's), Zorse's ministages,
resharding between stages, DP with ZeRO-1 and ZeRO-2, and the checks of a pipeline job the launcher
makes before any rank starts (job_checks).
`heteroauto` (HeteroAuto, the planner) is pure Python and never imports torch.
"""
