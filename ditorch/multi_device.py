"""Single-process copies across a vendor's devices, for nn.DataParallel (torch.nn.parallel.comm).

torch.nn.parallel.comm calls C functions (torch._C._broadcast_coalesced, _scatter, _gather, ...) that
only CUDA builds of torch carry, and only for CUDA tensors. These are their equivalents for any device
type, built on Tensor.to: the same arguments (device indices of `device_type`; -1 means the CPU where
torch's allow it) and the same results (a tensor already on its target device is returned as it is,
as CUDA's are).
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch


class MultiDeviceCopies:
    """The comm primitives of torch._C for the devices of `device_type`."""

    def __init__(self, device_type: str):
        self.device_type = device_type

    def device(self, index: int) -> torch.device:
        return torch.device("cpu") if index == -1 else torch.device(self.device_type, index)

    def primitives(self) -> dict:
        """torch._C name -> its replacement."""
        return {
            "_broadcast": self.broadcast,
            "_broadcast_out": self.broadcast_out,
            "_broadcast_coalesced": self.broadcast_coalesced,
            "_scatter": self.scatter,
            "_scatter_out": self.scatter_out,
            "_gather": self.gather,
            "_gather_out": self.gather_out,
        }

    def broadcast(self, tensor: torch.Tensor, devices: Sequence[int]) -> list[torch.Tensor]:
        return [tensor.to(self.device(index)) for index in devices]

    @staticmethod
    def broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        for target in out:
            target.copy_(tensor)
        return list(out)

    def broadcast_coalesced(self, tensors: Sequence[torch.Tensor], devices: Sequence[int],
                            buffer_size: int = 0) -> list[list[torch.Tensor]]:
        """[per device: copies of `tensors`]; buffer_size (CUDA's coalescing unit) does not change the result."""
        return [[tensor.to(self.device(index)) for tensor in tensors] for index in devices]

    def scatter(self, tensor: torch.Tensor, devices: Sequence[int], chunk_sizes: Sequence[int] | None, dim: int,
                streams: Sequence | None) -> list[torch.Tensor]:
        chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes else tensor.chunk(len(devices), dim)
        outputs = []
        for position, (chunk, index) in enumerate(zip(chunks, devices)):
            with _on_stream(streams[position] if streams else None):
                outputs.append(chunk.to(self.device(index)))
        return outputs

    @staticmethod
    def scatter_out(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int,
                    streams: Sequence | None) -> list[torch.Tensor]:
        chunks = tensor.split([target.size(dim) for target in out], dim)
        for position, (chunk, target) in enumerate(zip(chunks, out)):
            with _on_stream(streams[position] if streams else None):
                target.copy_(chunk)
        return list(out)

    def gather(self, tensors: Sequence[torch.Tensor], dim: int, destination: int | None) -> torch.Tensor:
        index = torch.accelerator.current_device_index() if destination is None else destination
        target = self.device(index)
        return torch.cat([tensor.to(target) for tensor in tensors], dim)

    @staticmethod
    def gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.cat([tensor.to(out.device) for tensor in tensors], dim, out=out)


def _on_stream(stream):
    return stream if stream is not None else contextlib.nullcontext()
