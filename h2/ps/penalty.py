"""The pseudo-gradient penalty (Di-PS section 4.1) as plain arithmetic on the numbers the shards report.

For each cluster j of a round, shard i reports the dot products <Δ^{i,j}, Δ^{i,k}> of its slice of the
clusters' pseudo-gradients (its Gram matrix). From them the master derives:

- the cluster's norm G_j = Σ_i ||Δ^{i,j}||_2 (the sum of per-shard L2 norms);
- its score E_j = (G_j - μ) / σ against the exponential moving mean μ and deviation σ of the
  accepted norms so far;
- the verdict: a non-finite norm is rejected; once `warmup_scores` scores are on record, a score
  above beta * max(1, max E) is rejected (E: every accepted score so far; the floor 1 keeps the rule
  at least a beta-sigma rule while the record's maximum is still small);
- the weights T_j / Σ T over the accepted clusters (T: tokens each consumed in the round);
- the clip coefficient min(1, clip_norm / ||δ||) of the averaged pseudo-gradient δ = Σ_j w_j Δ^j,
  whose squared norm Σ_i Σ_jk w_j w_k <Δ^{i,j}, Δ^{i,k}> needs no second pass over the shards.

After the verdict the accepted norms update the moving statistics one at a time, in cluster-id
order: μ' = α G + (1 - α) μ, σ' = sqrt((1 - α) σ² + α (G - μ')²); the first norm ever seen sets μ = G,
σ = 0. The statistics are one pair for the whole run (a cluster is judged against every cluster's
history), and a rejected norm leaves them untouched.

Pure Python (no torch): the master runs it, and the tests check it against hand-computed values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass
class PenaltyState:
    """The moving statistics of accepted norms (the master snapshots and restores this)."""
    mean: float = 0.0
    deviation: float = 0.0
    norms_seen: int = 0
    scores_seen: int = 0
    max_score: float = -math.inf

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PenaltyState":
        return cls(**data)


@dataclass
class Verdict:
    norms: dict[str, float]
    scores: dict[str, float | None]  # None: no statistics yet when this norm arrived
    accepted: list[str]
    rejected: dict[str, str]  # cluster id -> why
    weights: dict[str, float] = field(default_factory=dict)
    update_norm: float = 0.0  # ||δ|| of the weighted average, before clipping
    clip: float = 1.0  # the factor applied to δ


def cluster_norms(grams: list[dict[str, dict[str, float]]], clusters: list[str]) -> dict[str, float]:
    """G_j = Σ_i sqrt(<Δ^{i,j}, Δ^{i,j}>) over the shards' Gram matrices."""
    return {j: sum(math.sqrt(gram[j][j]) if gram[j][j] >= 0 else math.nan for gram in grams) for j in clusters}


def score(state: PenaltyState, norm: float) -> float | None:
    """E = (G - μ) / σ against the statistics before this round (None before the first norm)."""
    if state.norms_seen == 0:
        return None
    if state.deviation > 0:
        return (norm - state.mean) / state.deviation
    return 0.0 if norm == state.mean else math.copysign(math.inf, norm - state.mean)


def threshold(state: PenaltyState, beta: float, warmup_scores: int) -> float:
    if state.scores_seen < warmup_scores:
        return math.inf
    return beta * max(1.0, state.max_score)


def observe(state: PenaltyState, norm: float, norm_score: float | None, alpha: float) -> None:
    """Fold one accepted norm (and its score) into the statistics."""
    if state.norms_seen == 0:
        state.mean, state.deviation = norm, 0.0
    else:
        mean = alpha * norm + (1 - alpha) * state.mean
        state.deviation = math.sqrt((1 - alpha) * state.deviation**2 + alpha * (norm - mean)**2)
        state.mean = mean
    state.norms_seen += 1
    if norm_score is not None:
        state.scores_seen += 1
        state.max_score = max(state.max_score, norm_score)


def weighted_update_norm(grams: list[dict[str, dict[str, float]]], weights: dict[str, float]) -> float:
    """||Σ_j w_j Δ^j|| from the shards' Gram matrices."""
    square = sum(weights[j] * weights[k] * gram[j][k] for gram in grams for j in weights for k in weights)
    return math.sqrt(max(square, 0.0)) if math.isfinite(square) else math.nan


def token_weights(tokens: dict[str, int], accepted: list[str]) -> dict[str, float]:
    total = sum(tokens[j] for j in accepted)
    return {j: tokens[j] / total for j in accepted} if total > 0 else {}


def judge(state: PenaltyState, grams: list[dict[str, dict[str, float]]], tokens: dict[str, int], *, alpha: float,
          beta: float, clip_norm: float, warmup_scores: int, penalize: bool = True) -> Verdict:
    """One round's verdict; updates `state` with the accepted norms.

    With `penalize` False (modes sync and async) every cluster is accepted and nothing is clipped;
    the norms and scores are still computed for the round's metrics, and the statistics still learn."""
    clusters = sorted(tokens)
    norms = cluster_norms(grams, clusters)
    scores = {j: score(state, norms[j]) for j in clusters}
    limit = threshold(state, beta, warmup_scores)
    accepted, rejected = [], {}
    for j in clusters:
        if penalize and not math.isfinite(norms[j]):
            rejected[j] = f"norm is {norms[j]}"
        elif penalize and scores[j] is not None and scores[j] > limit:
            rejected[j] = f"score {scores[j]:.3g} > {limit:.3g}"
        else:
            accepted.append(j)
    for j in accepted:
        if math.isfinite(norms[j]):
            observe(state, norms[j], scores[j], alpha)
    weights = token_weights(tokens, accepted)
    update_norm = weighted_update_norm(grams, weights) if weights else 0.0
    clip = 1.0
    if penalize and clip_norm > 0 and update_norm > clip_norm:
        clip = clip_norm / update_norm
    return Verdict(norms=norms, scores=scores, accepted=accepted, rejected=rejected, weights=weights,
                   update_norm=update_norm, clip=clip)
