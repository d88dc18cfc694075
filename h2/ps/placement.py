"""Where the parameter server's shards go (Di-PS section 3.1): at the candidate site i maximising B_iᵀ p,
B[i][j] the bandwidth from site i to cluster j and p the clusters' training throughputs. The one place
this is decided: the launcher (`h2 ps launch`, the run file's `sites`) and the simulator (`h2 ps simulate`)
both call `best_site`.
"""

from __future__ import annotations

from h2.core.dips import DipsConfig


def site_scores(bandwidth: list[list[float]], throughput: list[float]) -> list[float]:
    """B_iᵀ p for every candidate site i."""
    return [sum(link * rate for link, rate in zip(row, throughput)) for row in bandwidth]


def best_site(bandwidth: list[list[float]], throughput: list[float]) -> int:
    """argmax_i B_iᵀ p (the first site on a tie)."""
    scores = site_scores(bandwidth, throughput)
    return max(range(len(scores)), key=scores.__getitem__)


def cluster_throughputs(config: DipsConfig) -> list[float]:
    """p: each cluster's `throughput` from the run file, else its emulated speed (1 / step_time_s), else 1."""
    return [spec.throughput or (1.0 / spec.step_time_s if spec.step_time_s else 1.0) for spec in config.clusters]


def shard_site(config: DipsConfig) -> tuple[int, list[float]] | None:
    """The run file's site for the shards and every site's score; None when the run file lists no sites."""
    if not config.sites:
        return None
    bandwidth = [site.bandwidth_gbps for site in config.sites]
    throughput = cluster_throughputs(config)
    return best_site(bandwidth, throughput), site_scores(bandwidth, throughput)
