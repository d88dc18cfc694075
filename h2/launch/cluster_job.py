"""A pipeline job on a cluster file (`h2 train --strategy S --cluster C`): the checks made before any
rank starts, and the emulated chip each rank opens.

The launcher checks the whole job (every rank runs on this host); a rank started by hand under
torchrun checks the ranks of its own host (LOCAL_WORLD_SIZE of them) and then makes its dipu device
the chip type of its stage (h2.core.emulation), before the device first opens.
"""

from __future__ import annotations

import os

from h2.core.cluster import ClusterSpec
from h2.core.emulation import (busy_host_warning, check_core_share, describe_chip, emulated_stage_devices, host_cores,
                               rank_chips)
from h2.core.errors import UserError
from h2.core.links import rank_locations
from h2.core.strategy import Strategy
from heteroauto.evaluation import check_chips
from heteropp.emulated_chip import open_emulated_chip


def check_job(strategy: Strategy, cluster: ClusterSpec, source: str, threads: int,
              host_ranks: range | None = None) -> Strategy:
    """The strategy as it runs on `cluster` (stages of emulated chip types on the emulating device),
    after checking that the cluster has its chips and that the ranks on this host (`host_ranks`,
    default all) keep the emulation trustworthy. Raises a one-line UserError naming file and field."""
    check_chips(strategy, cluster, source)
    rank_locations(strategy, cluster, source)  # every node's ranks fit its chips_per_node
    strategy = emulated_stage_devices(strategy, cluster, source)
    chips = rank_chips(strategy, cluster, host_ranks)
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


def host_ranks_of_this_process() -> range:
    """The global ranks torchrun started on this host: this node's LOCAL_WORLD_SIZE consecutive ranks."""
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    first = rank - local_rank
    return range(first, first + local_world)


def chip_labels(cluster: ClusterSpec) -> dict[str, str]:
    return {chip.name: describe_chip(chip) for chip in cluster.chips}


def open_rank_chip(strategy: Strategy, cluster: ClusterSpec, rank: int, directory: str) -> str | None:
    """Make this process's dipu device the emulated chip type of `rank`'s stage (its host vendor
    profile is written to `directory`); None for a chip without emulation."""
    (chip,) = rank_chips(strategy, cluster, range(rank, rank + 1))
    return open_emulated_chip(chip, directory)
