"""HeteroPP: pipeline parallelism where each stage is one chip type with its own TP size,
layer count and recompute setting.

Owns: topology from a strategy, process groups, stage building, tensor parallelism, the executors
of a schedule's action lists (the schedules themselves are h2.core.schedule's), Zorse's ministages,
resharding between stages, DP with ZeRO-1 and ZeRO-2, and the checks of a pipeline job the launcher
makes before any rank starts (job_checks).
May import h2.core, h2.model, h2.data, ditorch and dicomm; never the planner (heteroauto, a sibling
that reads the same strategy files), h2.ps, h2.train, h2.launch or h2.cli.
"""
