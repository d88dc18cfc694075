"""HeteroAuto: the strategy search over a heterogeneous cluster, its cost and memory models,
profiles, the event-driven pipeline simulator and the `heteroauto` CLI.

Reasons about numbers only: must not import torch at module level (profiling imports it lazily).
"""
