"""The H2 paper's cost model (section 4.3.2), over a list of pipeline stages.

    T = max_i ( b * T_i^comp + T_i^update + alpha * sum_{j != i} T_j^comp )
    T_i^comp   = layers_i * (t_fwd + t_bwd + r_i * t_recomp)   (per micro-batch, at the stage's TP size)
    T_i^update = layers_i * t_update(dp, tp)

The paper writes layers_i as ceil(l_i / s_pp,i), the largest share of a chip group's layers; here each
stage carries its own count, which is the same for the group's bottleneck stage. Stage-to-stage
transfers are not in the model (the simulator adds them).
"""

from __future__ import annotations

from typing import Sequence


def iteration_time_s(compute_s: Sequence[float], update_s: Sequence[float], micro_batches: int, alpha: float) -> float:
    total = sum(compute_s)
    return max(micro_batches * c + u + alpha * (total - c) for c, u in zip(compute_s, update_s))


def pipeline_closed_form_s(compute_s: Sequence[float], micro_batches: int) -> float:
    """sum_i T_i + (b - 1) * max_i T_i: the cost model with alpha = 1 and no update time."""
    return sum(compute_s) + (micro_batches - 1) * max(compute_s)
