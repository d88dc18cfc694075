"""A pipeline job on a cluster file (`h2 train --strategy S --cluster C`): the checks made before any
rank starts, and how the cluster's chips appear in outputs.

The launcher checks the whole job (every rank of this host's share runs here) once; the ranks get
the resolved job (h2.launch.job) and check nothing of it again.
"""

from __future__ import annotations

from h2.core.cluster import ClusterSpec
from h2.core.emulation import (
    busy_host_warning,
    check_core_share,
    describe_chip,
    emulated_stage_devices,
    host_cores,
    rank_chips,
)
from h2.core.errors import UserError
from h2.core.links import rank_locations
from h2.core.strategy import Strategy
from heteroauto.evaluation import check_chips


def check_job(strategy: Strategy, cluster: ClusterSpec, source: str, threads: int) -> Strategy:
    """The strategy as it runs on `cluster` (stages of emulated chip types on the emulating device),
    after checking that the cluster has its chips and that the job's ranks keep the emulation
    trustworthy on this host. Raises a one-line UserError naming file and field."""
    check_chips(strategy, cluster, source)
    rank_locations(strategy, cluster, source)  # every node's ranks fit its chips_per_node
    strategy = emulated_stage_devices(strategy, cluster, source)
    chips = rank_chips(strategy, cluster)
    if any(chip.emulation is not None for chip in chips):
        if threads != 1:
            raise UserError(f"--threads {threads}: an emulated chip's kernels are timed by the CPU time of the "
                            f"thread that runs them; run the ranks of cluster {cluster.source} with --threads 1")
        check_core_share(chips, host_cores(), cluster.source)
    return strategy


def host_warning(strategy: Strategy, cluster: ClusterSpec) -> str | None:
    """The launcher's warning when the host is already busy (all of the job's ranks run here)."""
    chips = rank_chips(strategy, cluster)
    if not any(chip.emulation is not None for chip in chips):
        return None
    return busy_host_warning(chips, host_cores())


def chip_labels(cluster: ClusterSpec) -> dict[str, str]:
    return {chip.name: describe_chip(chip) for chip in cluster.chips}
