"""The resolved pipeline job: everything a rank runs with, decided once by the launcher
(h2.launch.pipeline_job) and handed to every rank as one file (`python -m h2.cli.rank --job FILE`).

    source: configs/strategies/local-2site-pp2.yaml   # the user's strategy file, for messages only
    strategy: {...}            # the strategy as it runs: emulated stages on their device, explicit orders
    train: {...}               # TrainConfig, every field
    explicit: [steps, lr]      # the TrainConfig fields the user gave (a resumed run keeps the others)
    pipeline: {...}            # PipelineOptions, every field
    ps: {...}                  # PSOptions, every field
    out: runs/pp
    resume: false
    overwrite: false
    chip_labels: {emu-big: "emu-big (emulated: 1x a host core, 80 MB)"}   # or null without a cluster
    stage_links: "link stage 0 -> 1 (emulated): ..."                       # or null without a cluster
    ranks:                     # per global rank
      - chip: emu-big          # the chip type it runs as
        device: dipu           # the device its stage runs on
        emulation: {...}       # the host vendor profile of an emulated chip (h2.core.emulation), or null
        vendor: host           # the DIPU vendor the rank loads (its chip type's `vendor`; DIPU_VENDOR)
        node: 0                # the node it sits on (index in rank order)
        links: [[intra_node, 100.0, 1.0], ...]   # per peer rank: link class, bandwidth GB/s, latency us

Nothing here checks user input: the launcher did, and the file is its output. Reading it builds the
configs and the strategy as they were written (their dataclasses assert their own invariants); a
rank never reads the cluster file or the strategy file, and never imports the planner.

Pure Python: imports only h2.core.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import yaml

from h2.core.config_io import dataclass_from_mapping
from h2.core.dips import PSOptions
from h2.core.links import Link, paced_link
from h2.core.strategy import Strategy
from h2.core.training import PipelineOptions, TrainConfig


@dataclass(frozen=True)
class PeerLink:
    """The link from one rank to one peer: its class and how fast it is."""
    link_class: str
    link: Link


@dataclass(frozen=True)
class RankEntry:
    """One rank of the job: the chip it runs as, its device, the host vendor profile that emulates
    the chip (None: the chip runs as it is), its node, its link to every rank (None: no cluster), and the
    DIPU vendor it loads (its chip type's)."""
    chip: str
    device: str
    emulation: dict | None = None
    node: int = 0
    links: tuple[PeerLink, ...] | None = None
    vendor: str = "host"


class JobLinks:
    """One rank's links to every other, as the job file lists them (h2.core.links.PeerLinks): what its
    pacing layers apply per peer (`paced_link`: with `kernel_shaped`, only the latency between nodes)."""

    def __init__(self, ranks: tuple[RankEntry, ...], rank: int, kernel_shaped: bool = False):
        assert ranks[rank].links is not None, "a job without a cluster has no links"
        self.ranks, self.rank, self.kernel_shaped = ranks, rank, kernel_shaped

    def to(self, peer: int) -> Link:
        """What pacing applies to messages from this rank to global rank `peer`."""
        across_nodes = self.ranks[self.rank].node != self.ranks[peer].node
        return paced_link(self.ranks[self.rank].links[peer].link, across_nodes, self.kernel_shaped)

    def class_to(self, peer: int) -> str:
        return self.ranks[self.rank].links[peer].link_class

    def link_to(self, peer: int) -> Link:
        return self.ranks[self.rank].links[peer].link

    def shaped_by_kernel(self, peer: int) -> bool:
        return self.kernel_shaped and self.ranks[self.rank].node != self.ranks[peer].node


@dataclass(frozen=True)
class ResolvedJob:
    source: str
    strategy: Strategy
    train: TrainConfig
    pipeline: PipelineOptions
    ps: PSOptions
    out: str
    ranks: tuple[RankEntry, ...]
    explicit: frozenset[str] = frozenset()
    resume: bool = False
    overwrite: bool = False
    chip_labels: dict[str, str] | None = None
    stage_links: str | None = None

    def __post_init__(self) -> None:
        assert len(self.ranks) == self.strategy.world_size, "one entry per rank of the strategy"

    def links(self, rank: int, kernel_shaped: bool = False) -> JobLinks | None:
        """`rank`'s links to every other rank; None for a job without a cluster."""
        return JobLinks(self.ranks, rank, kernel_shaped) if self.ranks[rank].links is not None else None


def write_job(path: str | os.PathLike, job: ResolvedJob) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(_job_to_dict(job), handle, sort_keys=False, default_flow_style=None)


def read_job(path: str | os.PathLike) -> ResolvedJob:
    with open(path, encoding="utf-8") as handle:
        return _job_from_dict(yaml.safe_load(handle), os.fspath(path))


def _job_to_dict(job: ResolvedJob) -> dict:
    configs = {
        "train": dataclasses.asdict(job.train), "pipeline": dataclasses.asdict(job.pipeline),
        "ps": dataclasses.asdict(job.ps)
    }
    return {
        "source": job.source, "strategy": job.strategy.to_dict(), **configs, "explicit": sorted(job.explicit),
        "out": job.out, "resume": job.resume, "overwrite": job.overwrite, "chip_labels": job.chip_labels,
        "stage_links": job.stage_links, "ranks": [_rank_to_dict(entry) for entry in job.ranks]
    }


def _rank_to_dict(entry: RankEntry) -> dict:
    links = None if entry.links is None else [[peer.link_class, peer.link.bandwidth_gbps, peer.link.latency_us]
                                              for peer in entry.links]
    return {
        "chip": entry.chip, "device": entry.device, "emulation": entry.emulation, "node": entry.node, "links": links,
        "vendor": entry.vendor
    }


def _job_from_dict(data: dict, path: str) -> ResolvedJob:
    configs = {
        "train": TrainConfig(**data["train"]), "pipeline": PipelineOptions(**data["pipeline"]),
        "ps": PSOptions(**data["ps"])
    }
    ranks = tuple(_rank_from_dict(entry) for entry in data["ranks"])
    return ResolvedJob(source=data["source"], strategy=_strategy_from_dict(data["strategy"], path), **configs,
                       out=data["out"], ranks=ranks, explicit=frozenset(data["explicit"]), resume=data["resume"],
                       overwrite=data["overwrite"], chip_labels=data["chip_labels"], stage_links=data["stage_links"])


def _strategy_from_dict(data: dict, path: str) -> Strategy:
    """The strategy as the launcher wrote it (Strategy.to_dict): built, not validated again."""
    data = dict(data)
    model = data.pop("model")
    strategy = dataclass_from_mapping(Strategy, data, f"{path}: strategy")
    strategy.model = model
    return strategy


def _rank_from_dict(data: dict) -> RankEntry:
    links = None if data["links"] is None else tuple(
        PeerLink(name, Link(float(gbps), float(us))) for name, gbps, us in data["links"])
    return RankEntry(chip=data["chip"], device=data["device"], emulation=data["emulation"], node=data["node"],
                     links=links, vendor=data.get("vendor", "host"))
