"""The bottom layer: what every other layer shares, and nothing that needs them.

errors (the one user error and CLI runner), config_io and flags (YAML into dataclasses, flags from
dataclasses, job files), model_config (the model's shape and exact accounting), cluster (the cluster
file's spec and loader; it imports only the leaves chip_type, a chip type and its emulation section, and
placement, where chips sit: a node within a site, a link per level), links (the queries over a loaded
cluster: its nodes, the link between two ranks, the arrival rule of link emulation), emulation (the
trust rule and the host vendor's settings of emulated chips), strategy (the strategy file), schedule
(the pipeline schedule IR), training (the job's
configs), devices (device names, which collective backend serves a device type), ranks (one function
run as N local processes: the launcher of the multi-process tests and benchmarks), files (atomic
writes, a file's SHA-256 beside it, errno text: checkpoints and Di-PS snapshots share them), scratch
(TMPDIR folders that name their owner process; the next start removes those of dead owners).

Imports nothing from the project outside h2.core and never torch at module level (the planner runs
without torch); functions that need torch import it themselves.
"""
