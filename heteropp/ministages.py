"""Zorse's ministages on one group of ranks: a stage holding several layer chunks, run in GPipe order
(every micro-batch through chunk 0, then chunk 1, ...; backwards in reverse chunk order) from the
action list h2.core.schedule.gpipe_ministages builds, a STEP per chunk right after its last
backward, and the offload of what a chunk does not need until later to host memory:

  activations   every tensor autograd saves for a chunk's backward is copied to the host when the
                forward saves it and back to the device when the backward needs it
                (torch.autograd.graph.saved_tensors_hooks)
  parameters    a chunk's parameters wait in host memory while another chunk computes; they are
                copied to the device before the chunk's first action and back after its last one
                (a saved tensor that is a view of a parameter is kept as that view's geometry and
                rebuilt from the parameter when the backward needs it)

On an emulated discrete chip (dipu, not host-accessible) each of these is a real copy between
device and host memory through the vendor's memcpy.

What happens at a STEP is the engine's (heteropp.engine): the executor calls `on_step(chunk)`.
Must not import the engine or anything of h2 above core and model.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from h2.core.errors import UserError
from h2.model.transformer import language_model_loss

OFFLOAD_KINDS = ("activations", "parameters")


def runs_ministages(strategy, schedule: str, source: str = "strategy") -> bool:
    """Whether a strategy runs on this executor: ministages, offload or the GPipe schedule; refused in
    one line where it has several stages (the wrap-around transfer from the last stage's chunk c to
    stage 0's chunk c + 1 is not written)."""
    if not (strategy.ministages > 1 or strategy.offload or schedule == "gpipe"):
        return False
    if len(strategy.stages) > 1:
        raise UserError(f"{source}: field 'ministages': this runtime runs GPipe, ministages and offload on a strategy of one "
                        f"stage (one group), this one has {len(strategy.stages)} stages")
    return True


class ParameterHome:
    """Moves one chunk's parameters between the device and host memory (real copies both ways)."""

    def __init__(self, params: list[nn.Parameter], device: torch.device):
        self.params, self.device = params, device
        self.on_device = True

    def to_host(self) -> None:
        if self.on_device:
            for param in self.params:
                param.data = param.data.to("cpu")
            self.on_device = False

    def to_device(self) -> None:
        if not self.on_device:
            for param in self.params:
                param.data = param.data.to(self.device)
            self.on_device = True


class MinistageExecutor:
    def __init__(self, chunks: list[nn.Module], *, device: torch.device, offload: tuple[str, ...] = (),
                 autocast: torch.dtype | None = None):
        """`chunks`: this rank's layer chunks in chunk order (the first embeds on the pipeline's first
        chunk, the last computes logits on its last); `offload`: a subset of OFFLOAD_KINDS."""
        self.chunks, self.device, self.autocast = chunks, torch.device(device), autocast
        self.offload = tuple(offload)
        self.homes = [ParameterHome(list(chunk.parameters()), self.device) for chunk in chunks]
        self.host_copies = 0   # tensors copied to the host by offload in the last run
        if "parameters" in self.offload:
            for home in self.homes:
                home.to_host()

    def run(self, actions, tokens: list[torch.Tensor], targets: list[torch.Tensor], loss_scale: float,
            on_step) -> torch.Tensor:
        """Run `actions` (F, B and STEP of one stage, no communication) on micro-batches `tokens` /
        `targets`; returns the sum of the scaled losses."""
        last = len(self.chunks) - 1
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        inputs: dict[tuple[int, int], torch.Tensor] = {}
        input_grads: dict[tuple[int, int], torch.Tensor] = {}
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self.host_copies = 0
        for action in actions:
            chunk, micro_batch = action.chunk, action.micro_batch
            if action.kind in ("F", "B", "STEP"):
                self._make_resident(chunk)
            if action.kind == "F":
                x = tokens[micro_batch] if chunk == 0 else outputs[(chunk - 1, micro_batch)].detach().requires_grad_()
                with self._saving(chunk), self._compute_precision():
                    output = self.chunks[chunk](x)
                    if chunk == last:
                        output = language_model_loss(output, targets[micro_batch]) * loss_scale
                        loss_sum += output.detach()
                inputs[(chunk, micro_batch)], outputs[(chunk, micro_batch)] = x, output
            elif action.kind == "B":
                grad = None if chunk == last else input_grads.pop((chunk + 1, micro_batch))
                torch.autograd.backward(outputs.pop((chunk, micro_batch)), grad_tensors=grad)
                x = inputs.pop((chunk, micro_batch))
                if chunk > 0:
                    input_grads[(chunk, micro_batch)] = x.grad
            elif action.kind == "STEP":
                on_step(chunk)
            else:
                raise ValueError(f"a ministage group runs F, B and STEP only, got {action}")
        self._make_resident(None)
        return loss_sum

    @contextlib.contextmanager
    def resident(self, chunk: int):
        """`chunk`'s parameters on the device for the duration (back to the host after, under offload)."""
        self._make_resident(chunk)
        try:
            yield
        finally:
            self._make_resident(None)

    def _make_resident(self, chunk: int | None) -> None:
        """Under parameter offload only `chunk`'s parameters stay on the device (None: none)."""
        if "parameters" not in self.offload:
            return
        for index, home in enumerate(self.homes):
            if index != chunk:
                home.to_host()
        if chunk is not None:
            self.homes[chunk].to_device()

    def _compute_precision(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    def _saving(self, chunk: int):
        """What autograd keeps for `chunk`'s backward, under the offload asked for."""
        if not self.offload:
            return contextlib.nullcontext()
        views_of = {param.untyped_storage().data_ptr(): param for param in self.homes[chunk].params}
        offload_activations = "activations" in self.offload

        def pack(tensor: torch.Tensor):
            param = views_of.get(tensor.untyped_storage().data_ptr()) if tensor.device == self.device else None
            if param is not None and "parameters" in self.offload:
                return ("parameter", param, tensor.size(), tensor.stride(), tensor.storage_offset())
            if offload_activations and tensor.device == self.device and param is None:
                self.host_copies += 1
                return ("host", tensor.to("cpu"))
            return ("kept", tensor)

        def unpack(packed):
            if packed[0] == "parameter":
                _, param, size, stride, offset = packed
                return param.detach().as_strided(size, stride, offset)
            if packed[0] == "host":
                return packed[1].to(self.device)
            return packed[1]

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
