"""The closed-form cost model: the H2 paper's formula (section 4.3.2) over a list of pipeline stages.

    T = max_i ( b * T_i + T_i^update + alpha * sum_{j != i} T_j )

With the paper's terms (stage_terms "paper") T_i is the stage's layers' compute per micro-batch,
layers_i * (t_fwd + t_bwd + r_i * t_recomp), and T_i^update = layers_i * t_update(dp, tp). The paper
writes layers_i as ceil(l_i / s_pp,i); here each stage carries its own count.

With the full terms (stage_terms "full") T_i also holds the embedding (first stage) or head and loss
(last stage), and twice the transfer of one micro-batch to the next stage (activation forward,
gradient backward): T_i = compute_i + 2 * send_i. Charging each boundary to its upstream stage makes
the fill and drain path exact (alpha * sum_j T_j crosses every boundary twice) and bounds 1F1B's
steady state from above: its period is max_i max(c_i, (sum_{j>=i} c_j + 2 sum_{k>=i} send_k) / (P - i)),
never more than max_i (c_i + 2 send_i) (tests check the replay never exceeds it).
"""

from __future__ import annotations

from typing import Sequence

from heteroauto.stage_terms import StageTerms


def iteration_time_s(compute_s: Sequence[float], update_s: Sequence[float], micro_batches: int, alpha: float) -> float:
    total = sum(compute_s)
    return max(micro_batches * c + u + alpha * (total - c) for c, u in zip(compute_s, update_s))


def stage_busy_s(terms: StageTerms) -> float:
    """T_i: what the stage contributes per micro-batch, its compute and its boundary's two transfers."""
    return terms.compute_s + 2 * terms.send_s


def pipeline_time_s(terms: Sequence[StageTerms], micro_batches: int, alpha: float) -> float:
    return iteration_time_s([stage_busy_s(t) for t in terms], [t.update_s for t in terms], micro_batches, alpha)


def pipeline_closed_form_s(compute_s: Sequence[float], micro_batches: int) -> float:
    """sum_i T_i + (b - 1) * max_i T_i: the cost model with alpha = 1 and no update time."""
    return sum(compute_s) + (micro_batches - 1) * max(compute_s)
