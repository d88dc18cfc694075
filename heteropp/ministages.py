"""Zorse's ministages: each stage (a group of ranks) holds several layer chunks, run in GPipe order
(every micro-batch through the pipeline's chunk 0 on every stage in turn, then chunk 1, ...; backwards
in reverse) from the action list h2.core.schedule.gpipe_ministages builds, a STEP per chunk right after
its last backward, and the offload of what a chunk does not need until later to host memory.

With one stage a chunk hands its output to the next chunk on the same rank. With several, chunk c's
output goes to the next stage's chunk c, and the last stage's chunk c wraps around to stage 0's
chunk c + 1 (gradients the other way), through the same resharder and p2p path as every other stage
boundary (heteropp.resharding).

Offload:

  activations   every tensor autograd saves for a chunk's backward is copied to the host when the
                forward saves it and back to the device when the backward needs it
                (torch.autograd.graph.saved_tensors_hooks)
  parameters    a chunk's parameters wait in host memory while another chunk computes; they are
                copied to the device before the chunk's first action and back after its last one
                (a saved tensor that is a view of a parameter is kept as that view's geometry and
                rebuilt from the parameter when the backward needs it)

On an emulated discrete chip (dipu, not host-accessible) each of these is a real copy between
device and host memory through the vendor's memcpy.

What happens at a STEP is the engine's (heteropp.engine): the executor calls `on_step(chunk)`, which
returns False where it left the chunk's parameters unchanged (its step deferred to `each_resident`).
Must not import the engine or anything of h2 above core and model.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

from h2.model.transformer import language_model_loss
from heteropp.p2p import BACKWARD, FORWARD
from heteropp.resharding import PendingTensor, Resharder

OFFLOAD_KINDS = ("activations", "parameters")


def _copies_to(tensors: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    return [tensor.to(device) for tensor in tensors]


def _pinned_copies(tensors: list[torch.Tensor], non_blocking: bool = False) -> list[torch.Tensor]:
    """Copies in page-locked host memory (what an asynchronous copy to or from a device needs)."""
    return [
        torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=non_blocking)
        for tensor in tensors
    ]


def _has_streams(device: torch.device) -> bool:
    return device.type != "cpu" and torch.accelerator.is_available() and \
        device.type == torch.accelerator.current_accelerator().type


class ThreadCopies:
    """Copies a worker thread makes (devices without streams): usable once the thread is done."""

    def __init__(self, future: Future):
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> list[torch.Tensor]:
        return self.future.result()


class ThreadLane:
    """Copies in the background on one worker thread (the CPU device, which has no streams)."""

    def __init__(self, name: str):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)

    def copy(self, tensors: list[torch.Tensor], target: torch.device | str, after=None) -> ThreadCopies:
        return ThreadCopies(self.pool.submit(_copies_to, tensors, target))


class StreamCopies:
    """Asynchronous copies queued on a side stream, with the event that marks their end. `sources`
    stay referenced until then (a device copy being read by a copy out is not freed under it)."""

    def __init__(self, copies: list[torch.Tensor], sources: list[torch.Tensor], end: torch.Event, device: torch.device,
                 to_device: bool):
        self.copies, self.sources, self.end, self.device, self.to_device = copies, sources, end, device, to_device

    def done(self) -> bool:
        return self.end.query()

    def result(self) -> list[torch.Tensor]:
        """The copies; copies to the device are usable by the calling thread's stream from here on
        (it waits for their event on the device, the host does not wait)."""
        if self.to_device:
            torch.accelerator.current_stream(self.device).wait_event(self.end)
        return self.copies

    def wait_on_host(self) -> None:
        self.end.synchronize()
        self.sources = []


class StreamLane:
    """Copies on a side stream of the device (a DMA engine beside the compute on a real chip, a copy
    engine of its own on the emulated one): a copy to the device waits on the device only for the
    host copy it reads (`after`, a copy out of the same parameters); a copy to the host waits for the
    work queued on the compute stream before it (the optimizer step that wrote the parameters). The
    host never waits here: the compute stream waits for a copy in's event before the chunk's kernels
    (`StreamCopies.result`)."""

    def __init__(self, device: torch.device):
        index = torch.accelerator.current_device_index() if device.index is None else device.index
        self.device = torch.device(device.type, index)
        self.stream = torch.Stream(device=self.device)

    def copy(self, tensors: list[torch.Tensor], target: torch.device | str,
             after: StreamCopies | None = None) -> StreamCopies:
        to_device = torch.device(target).type == self.device.type
        compute = torch.accelerator.current_stream(self.device)
        if to_device and after is not None:
            self.stream.wait_event(after.end)
        elif not to_device:
            self.stream.wait_event(compute.record_event())
        torch.accelerator.set_stream(self.stream)
        try:
            copies = ([tensor.to(self.device, non_blocking=True)
                       for tensor in tensors] if to_device else _pinned_copies(tensors, non_blocking=True))
        finally:
            torch.accelerator.set_stream(compute)
        return StreamCopies(copies, tensors, self.stream.record_event(), self.device, to_device)


class ParameterHome:
    """Moves one chunk's parameters between the device and host memory (real copies both ways), at
    once or, given a lane (a side stream, or a worker thread where the device has no streams), in the
    background (`move`; `settle` swaps the copies in: only the calling thread ever rebinds a
    parameter's data).

    The host copies stay while the parameters are on the device: until the parameters change there
    (`modified`: the executor calls it after the chunk's optimizer step) going back to the host is
    only dropping the device copies, with nothing to copy (the forward and the backward read the
    parameters, they do not write them)."""

    def __init__(self, params: list[nn.Parameter], device: torch.device, pinned: bool = False):
        self.params, self.device, self.pinned = params, device, pinned
        self.on_device = True
        self.moving: tuple[bool, ThreadCopies | StreamCopies] | None = None  # (to the device?, the copies)
        self.written: StreamCopies | None = None  # a copy to the host that may still be under way
        self.host: list[torch.Tensor] | None = None  # host copies equal to the parameters, if any
        self.prefetches = 0  # moves to the device started in the background
        self.copies_out = 0  # moves to the host that copied the parameters
        self.drops = 0  # moves to the host that only dropped the device copies

    def modified(self) -> None:
        """The parameters changed on the device: the host copies are stale."""
        if self.on_device or (self.moving is not None and self.moving[0]):
            self.host = None

    def to_host(self) -> None:
        self.settle()
        if self.on_device and not self._drop_device_copies():
            self.copies_out += 1
            tensors = [param.data for param in self.params]
            self._rebind(_pinned_copies(tensors) if self.pinned else _copies_to(tensors, "cpu"), on_device=False)
        self.wait_for_host_copies()

    def wait_for_host_copies(self) -> None:
        """Wait (on the host) for a copy to the host still under way: its host copies hold the
        parameters from here on."""
        if self.written is not None:
            self.written.wait_on_host()
            self.written = None

    def _drop_device_copies(self) -> bool:
        """Back to the host copies if they are current (nothing to copy); whether they were."""
        if self.host is None:
            return False
        self.drops += 1
        self._rebind(self.host, on_device=False)
        return True

    def to_device(self) -> None:
        self.settle()
        if not self.on_device:
            self.wait_for_host_copies()
            self.host = [param.data for param in self.params]
            self._rebind(_copies_to(self.host, self.device), on_device=True)

    def move(self, lane: ThreadLane | StreamLane, to_device: bool) -> None:
        """Start copying the parameters to the device (or the host) on `lane`; they keep their
        current data until `settle`."""
        if self.moving is not None and self.moving[0] == to_device:
            if self.moving[1].done():
                self.settle()  # frees the device copy of parameters that reached the host
            return
        self.settle()
        if self.on_device == to_device or (not to_device and self._drop_device_copies()):
            return
        target = self.device if to_device else "cpu"
        if to_device:
            self.host = [param.data for param in self.params]
        else:
            self.copies_out += 1
        self.moving = (to_device, lane.copy([param.data for param in self.params], target, after=self.written))
        self.prefetches += int(to_device)

    def settle(self) -> None:
        """Give the parameters the copies of a background move, if any: a worker's once it is done
        (the host waits), a stream's at once (the device waits for a copy to it before the chunk's
        kernels; a copy to the host is `written` until it ends)."""
        if self.moving is not None:
            to_device, copies = self.moving
            self.moving = None
            self._rebind(copies.result(), on_device=to_device)
            if not to_device and isinstance(copies, StreamCopies):
                self.written = copies

    def _rebind(self, copies: list[torch.Tensor], *, on_device: bool) -> None:
        for param, copy in zip(self.params, copies):
            param.data = copy
        self.on_device = on_device


class MinistageExecutor:

    def __init__(self, chunks: list[nn.Module], *, device: torch.device, offload: tuple[str, ...] = (),
                 autocast: torch.dtype | None = None, stage_index: int = 0, num_stages: int = 1,
                 resharder: Resharder | None = None, activation_shape: tuple[int, ...] = (), prefetch: bool = True):
        """`chunks`: this rank's layer chunks in chunk order (chunk c of stage s is the model's chunk
        c * num_stages + s: the first embeds on stage 0's chunk 0, the last computes logits on the last
        stage's last chunk); `offload`: a subset of OFFLOAD_KINDS. With several stages `resharder`
        moves activations (of `activation_shape`) and their gradients between this rank's chunks and
        the neighbouring stages' (the last stage's chunk c feeds stage 0's chunk c + 1: the wrap-around).
        `prefetch` (under parameter offload): while a chunk computes, a side stream copies the next
        chunk's parameters to the device and another the previous one's back to the host (two worker
        threads on a device without streams, the CPU)."""
        self.chunks, self.device, self.autocast = chunks, torch.device(device), autocast
        self.offload = tuple(offload)
        self.stage_index, self.num_stages = stage_index, num_stages
        self.resharder, self.activation_shape = resharder, tuple(activation_shape)
        if num_stages > 1 and resharder is None:
            raise ValueError("ministages over several stages need a resharder to reach the other stages")
        streams = prefetch and _has_streams(self.device)
        self.homes = [ParameterHome(list(chunk.parameters()), self.device, pinned=streams) for chunk in chunks]
        self.host_copies = 0  # tensors copied to the host by offload in the last run
        # one lane copies in, another out (two side streams, or two threads on a device without them): a
        # copy to the host waits for the device's queued work, and the next chunk's copy in must not
        # wait behind it
        self.worker = self.evictor = None
        if prefetch:
            self.worker = StreamLane(self.device) if streams else ThreadLane("ministage-prefetch")
            self.evictor = StreamLane(self.device) if streams else ThreadLane("ministage-evict")
        if "parameters" in self.offload:
            for home in self.homes:
                home.to_host()

    @property
    def prefetches(self) -> int:
        """Chunks whose parameters a side stream (or thread) copied to the device ahead of their use, so far."""
        return sum(home.prefetches for home in self.homes)

    @property
    def parameter_moves_out(self) -> tuple[int, int]:
        """Moves of a chunk's parameters to the host so far: (copied, only dropped: unchanged since
        they came to the device)."""
        return sum(home.copies_out for home in self.homes), sum(home.drops for home in self.homes)

    def _takes_tokens(self, chunk: int) -> bool:
        return self.stage_index == 0 and chunk == 0

    def _computes_loss(self, chunk: int) -> bool:
        return self.stage_index == self.num_stages - 1 and chunk == len(self.chunks) - 1

    def _consumer(self, chunk: int) -> tuple[int, int]:
        """(stage, chunk) that takes the output of this stage's `chunk`."""
        return (self.stage_index + 1, chunk) if self.stage_index < self.num_stages - 1 else (0, chunk + 1)

    def _producer(self, chunk: int) -> tuple[int, int]:
        """(stage, chunk) whose output is the input of this stage's `chunk`."""
        return (self.stage_index - 1, chunk) if self.stage_index > 0 else (self.num_stages - 1, chunk - 1)

    def run(self, actions, tokens: list[torch.Tensor], targets: list[torch.Tensor], loss_scale: float,
            on_step) -> torch.Tensor:
        """Run `actions` (this stage's list from gpipe_ministages) on micro-batches `tokens` /
        `targets`; returns the sum of the scaled losses. A message is tagged with the chunk that
        produced the activation, so the chunks' messages between two ranks never mix."""
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        inputs: dict[tuple[int, int], torch.Tensor] = {}
        input_grads: dict[tuple[int, int], torch.Tensor] = {}
        received: dict[tuple[str, int, int], PendingTensor] = {}
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self.host_copies = 0
        for home in self.homes:  # resident since the last run: anything may have written to them since
            home.modified()
        for position, action in enumerate(actions):
            chunk, micro_batch = action.chunk, action.micro_batch
            kind = action.kind
            if kind in ("F", "B"):
                self._post_receives_until_next_compute(actions, position + 1, received)
            if kind in ("F", "B", "STEP"):
                self._make_resident(chunk, self._next_chunk(actions, position, chunk))
            if kind == "F":
                x = self._forward_input(chunk, micro_batch, tokens, outputs, received)
                with self._saving(chunk), self._compute_precision():
                    output = self.chunks[chunk](x)
                    if self._computes_loss(chunk):
                        output = language_model_loss(output, targets[micro_batch]) * loss_scale
                        loss_sum += output.detach()
                inputs[(chunk, micro_batch)], outputs[(chunk, micro_batch)] = x, output
            elif kind == "B":
                grad = self._output_grad(chunk, micro_batch, input_grads, received)
                torch.autograd.backward(outputs.pop((chunk, micro_batch)), grad_tensors=grad)
                x = inputs.pop((chunk, micro_batch))
                if not self._takes_tokens(chunk):
                    input_grads[(chunk, micro_batch)] = x.grad
            elif kind == "STEP":
                if on_step(chunk) is not False:  # False: the parameters did not change (a deferred step)
                    self.homes[chunk].modified()
            elif kind == "SEND_F":
                stage, _ = self._consumer(chunk)
                self.resharder.send(outputs[(chunk, micro_batch)].detach(), stage, micro_batch, direction=FORWARD,
                                    chunk=chunk)
            elif kind == "SEND_B":
                stage, producer_chunk = self._producer(chunk)
                self.resharder.send(input_grads.pop((chunk, micro_batch)), stage, micro_batch, direction=BACKWARD,
                                    chunk=producer_chunk)
            elif kind in ("RECV_F", "RECV_B"):
                if (kind, chunk, micro_batch) not in received:
                    received[(kind, chunk, micro_batch)] = self._post_receive(kind, chunk, micro_batch)
            else:
                raise ValueError(f"a ministage stage runs F, B, STEP, SEND and RECV actions, got {action}")
        if self.worker is None:
            self._make_resident(None)
        # with prefetch the last chunk and the next step's first stay (two resident, as within a step):
        # no copy at the step's end or at the next one's start; `release` sends them home. No copy is
        # left in flight between steps, when others may write the parameters (a checkpoint, a PS pull)
        for home in self.homes:
            home.settle()
            home.wait_for_host_copies()
        if self.resharder is not None:
            self.resharder.p2p.wait_sends()
        return loss_sum

    def release(self) -> None:
        """Every chunk's parameters back to host memory (under parameter offload; after the last step)."""
        self._make_resident(None)

    def _post_receives_until_next_compute(self, actions, start: int, received: dict) -> None:
        """Post the receives listed before the next compute action, so they arrive while this one runs
        (as heteropp.executor's prefetch)."""
        for action in actions[start:]:
            if action.kind in ("F", "B"):
                return
            key = (action.kind, action.chunk, action.micro_batch)
            if action.kind in ("RECV_F", "RECV_B") and key not in received:
                received[key] = self._post_receive(action.kind, action.chunk, action.micro_batch)

    def _post_receive(self, kind: str, chunk: int, micro_batch: int) -> PendingTensor:
        if kind == "RECV_F":
            stage, producer_chunk = self._producer(chunk)
            return self.resharder.post_recv(self.activation_shape, torch.float32, stage, micro_batch,
                                            device=self.device, direction=FORWARD, chunk=producer_chunk)
        stage, _ = self._consumer(chunk)
        return self.resharder.post_recv(self.activation_shape, torch.float32, stage, micro_batch, device=self.device,
                                        direction=BACKWARD, chunk=chunk)

    def _forward_input(self, chunk: int, micro_batch: int, tokens, outputs, received) -> torch.Tensor:
        if self._takes_tokens(chunk):
            return tokens[micro_batch]
        if self.num_stages == 1:
            return outputs[(chunk - 1, micro_batch)].detach().requires_grad_()
        return received.pop(("RECV_F", chunk, micro_batch)).wait().requires_grad_()

    def _output_grad(self, chunk: int, micro_batch: int, input_grads, received) -> torch.Tensor | None:
        if self._computes_loss(chunk):
            return None
        if self.num_stages == 1:
            return input_grads.pop((chunk + 1, micro_batch))
        return received.pop(("RECV_B", chunk, micro_batch)).wait()

    def each_resident(self, chunks: list[int]):
        """Yield `chunks` in turn, each with its parameters on the device (the next one's on their
        way under prefetch); all back to the host after, under offload."""
        try:
            for position, chunk in enumerate(chunks):
                self._make_resident(chunk, chunks[position + 1] if position + 1 < len(chunks) else None)
                yield chunk
                self.homes[chunk].modified()  # the caller stepped it
        finally:
            self._make_resident(None)

    def _make_resident(self, chunk: int | None, upcoming: int | None = None) -> None:
        """Under parameter offload only `chunk`'s parameters stay on the device (None: none); with
        prefetch, `upcoming`'s too, on their way there on the side stream (the rest on their way
        back to the host)."""
        if "parameters" not in self.offload:
            return
        if self.worker is None or upcoming is None:
            for index, home in enumerate(self.homes):
                if index != chunk:
                    home.to_host()
        else:
            self.homes[upcoming].move(self.worker, to_device=True)
            for index, home in enumerate(self.homes):
                if index not in (chunk, upcoming):
                    home.move(self.evictor, to_device=False)
        if chunk is not None:
            self.homes[chunk].to_device()

    @staticmethod
    def _next_chunk(actions, position: int, chunk: int) -> int | None:
        """The chunk of the first compute action after `position` that is not `chunk`, the list read
        on from its start after its end (the next step runs it again; None: no other chunk)."""
        return next((a.chunk for a in actions[position + 1:] + actions[:position]
                     if a.kind in ("F", "B", "STEP") and a.chunk != chunk), None)

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
