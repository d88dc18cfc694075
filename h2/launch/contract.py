"""The contract between the launcher (h2.launch.launcher, h2.launch.pipeline_job) and its ranks
(h2.cli.rank): the resolved job file the launcher hands every rank (its format is h2.launch.job's,
re-exported here), the marks a rank leaves in the job folder, the environment the launcher sets for a
rank, and how a rank is named in a line for the user. Both sides import these names from here only."""
from __future__ import annotations

import os

from h2.launch.job import JobLinks, PeerLink, RankEntry, ResolvedJob, read_job, write_job  # noqa: F401 (the job file)

# Set for every rank started in a namespace: the kernel shapes the bandwidth between nodes, the
# pacing layers add only the latency there (h2.core.links.RankLinks).
KERNEL_SHAPED_ENV = "H2_LINKS_KERNEL_SHAPED"
FINISHED_PREFIX = "finished-"  # each rank past the final barrier marks itself in the job folder
FAILURES_PREFIX = "failures-"  # h2.launch.agent: each torchrun's failed ranks and their exit statuses


def rank_names(topology):
    """'rank 3 (stage 1, chip B)' for every rank of `topology`."""

    def describe(rank: int) -> str:
        place = topology.place(rank)
        stage = topology.stages[place.stage]
        return f"rank {rank} (stage {stage.index}, chip {stage.replica_chip(place.dp_index)})"

    return describe


def mark_finished(job_folder: str, rank: int) -> None:
    """Tell the launcher this rank passed the final barrier: every rank has done its work, so each
    should now exit within seconds."""
    with open(os.path.join(job_folder, f"{FINISHED_PREFIX}{rank}"), "w"):
        pass


def job_finished(job_folder: str) -> bool:
    """Whether a rank has marked itself past the final barrier: then every rank has done all its steps."""
    return any(name.startswith(FINISHED_PREFIX) for name in os.listdir(job_folder or "."))
