"""The process groups one rank needs, created from a Topology.

Inside a stage (one chip type) tensor- and data-parallel groups use the chip's own collective
backend ("auto"), or one named by configuration (`--stage-backend gloo|dicomm`: on one host, dicomm's
shared memory plays the fast intra-node fabric); traffic that crosses stages (activations, gradients,
and the one scalar of the global gradient norm) uses the configurable cross-stage backend: "gloo"
(default) or "dicomm".
Every rank calls `build_groups` with the same arguments: torch.distributed requires all ranks to
create every group, members or not, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from h2.core.devices import collective_backend
from h2.core.errors import UserError
from h2.core.links import PeerLinks
from heteropp.topology import RankPlace, Topology

GLOO_DEVICE_TYPES = ("cpu", "cuda")  # the tensors gloo reads itself


def dicomm_registered() -> bool:
    """Whether DiComm's torch.distributed backend is available (importing it registers it)."""
    try:
        import dicomm  # noqa: F401
    except ImportError:
        pass
    return "dicomm" in dist.Backend.backend_list


def chip_backend(chip: str, device_type: str) -> str:
    """The collective backend for TP/DP inside a stage of `chip`: what h2.core.devices says serves
    the device type (gloo for chips emulated on CPU, NCCL on CUDA, DiComm on a vendor device such as
    dipu where it is built)."""
    backend = collective_backend(device_type)
    if backend is None:
        raise UserError(f"chip '{chip}': no collective backend for device type '{device_type}' "
                        f"(DiComm's torch.distributed backend is not built)")
    return backend


def p2p_needs_host_staging(p2p_backend: str, device_type: str) -> bool:
    """Whether cross-stage tensors must be copied through host memory: gloo reads only CPU (and CUDA)
    tensors; DiComm stages any device's tensors itself."""
    return p2p_backend == "gloo" and device_type not in GLOO_DEVICE_TYPES


def _check_available(name: str, flag: str) -> str:
    """Names were checked with the options (h2.core.training.PipelineOptions); this checks the build."""
    if name == "dicomm" and not dicomm_registered():
        raise UserError(f"{flag} dicomm: DiComm's torch.distributed backend is not registered "
                        f"in this build; use {flag} gloo")
    return name


def check_p2p_backend(name: str) -> str:
    return _check_available(name, "--p2p-backend")


def check_stage_backend(name: str, device_type: str = "cpu") -> str:
    _check_available(name, "--stage-backend")
    if name == "gloo" and device_type not in GLOO_DEVICE_TYPES:
        raise UserError(f"--stage-backend gloo cannot move {device_type} tensors inside a stage; "
                        f"use --stage-backend auto or dicomm")
    return name


@dataclass
class RankGroups:
    place: RankPlace
    tp: dist.ProcessGroup | None  # this rank's TP group (None when tp == 1)
    dp: dist.ProcessGroup | None  # this rank's DP group (None when dp == 1)
    next_boundary: dist.ProcessGroup | None  # ranks of this stage and the next (cross-stage backend)
    prev_boundary: dist.ProcessGroup | None  # ranks of the previous stage and this one
    wrap: dist.ProcessGroup | None  # last stage and stage 0 (ministages' wrap-around), this rank in either
    everyone: dist.ProcessGroup  # all ranks, cross-stage backend (global gradient norm)
    tp_ranks: list[int]


def group_options(backend: str, members: list[int], links: PeerLinks | None):
    """A dicomm group's pg_options: the emulated link from this rank to each member, which DiComm's
    shaping layer applies; None for other backends (gloo's cross-stage sends are paced in P2P)."""
    if backend != "dicomm" or links is None:
        return None
    from dicomm.torch_backend import GroupOptions
    return GroupOptions(links={peer: links.to(peer) for peer in members if peer != links.rank})


def new_group(members: list[int], backend: str, links: PeerLinks | None) -> dist.ProcessGroup:
    """A process group of `members` (every rank must call this, in the same order)."""
    return dist.new_group(members, backend=backend, pg_options=group_options(backend, members, links))


def build_groups(topology: Topology, rank: int, *, device_type: str = "cpu", p2p_backend: str = "gloo",
                 stage_backend: str = "auto", links: PeerLinks | None = None, wrap_around: bool = False) -> RankGroups:
    """`device_type`: the device of stages that do not name their own; `links`: this rank's emulated
    links, applied by DiComm to the groups it serves; `wrap_around`: the last stage sends to stage 0
    (ministages: heteropp.ministages), over boundary 0's group with two stages, its own with more."""
    place = topology.place(rank)
    stage = topology.stages[place.stage]
    mine: dict[str, dist.ProcessGroup | None] = {"tp": None, "dp": None, "next": None, "prev": None, "wrap": None}
    for info in topology.stages:
        stage_device = topology.device_type(info.index, device_type)
        backend = chip_backend(info.chip, stage_device) if stage_backend == "auto" else stage_backend
        # every TP group of the stage (one per replica), then every DP group (one per TP index)
        for kind, size, groups_of, count in (("tp", info.tp, info.tp_group, info.dp), ("dp", info.dp, info.dp_group,
                                                                                       info.tp)):
            for index in range(count):
                members = groups_of(index)
                group = new_group(members, backend, links) if size > 1 else None
                if rank in members:
                    mine[kind] = group
    for boundary in range(topology.num_stages - 1):
        members = topology.boundary_ranks(boundary)
        group = new_group(members, p2p_backend, links)
        if boundary == place.stage:
            mine["next"] = group
        if boundary + 1 == place.stage:
            mine["prev"] = group
    last = topology.num_stages - 1
    if wrap_around and last == 1:
        mine["wrap"] = mine["next"] or mine["prev"]
    elif wrap_around and last > 1:
        members = list(topology.stages[last].ranks) + list(topology.stages[0].ranks)
        group = new_group(members, p2p_backend, links)
        mine["wrap"] = group if place.stage in (0, last) else None
    world = list(range(topology.world_size))
    everyone = new_group(world, p2p_backend, links)
    return RankGroups(place=place, tp=mine["tp"], dp=mine["dp"], next_boundary=mine["next"], prev_boundary=mine["prev"],
                      wrap=mine["wrap"], everyone=everyone, tp_ranks=stage.tp_group(place.dp_index))
