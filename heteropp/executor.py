"""Runs one stage's list of schedule actions for one optimizer step.

The list (from heteropp.schedule, the same one `heteroauto simulate` replays) is executed in order:
  F       forward of a micro-batch (tokens on the first stage, the received activation elsewhere;
          the last stage also computes the loss)
  B       backward: with W actions in the list only the input gradients (weight gradients are
          deferred), otherwise the whole backward
  W       the deferred weight gradients of a micro-batch
  SEND_F / SEND_B   post this rank's part of the activation / input gradient to the next / previous stage
  RECV_F / RECV_B   post the receives of an activation / output gradient
Receives are waited for only when a compute action uses them. With `prefetch`, the receives listed
after a compute action and before the next one are posted before that compute starts, so they
arrive while it runs (the fine-grained overlap of P2P and compute).

With `autocast` (bf16) the stage's forward runs under torch.autocast, as the reference trainer runs
its model: parameters, optimizer state and the residual stream that crosses stages stay fp32 (the
master weights), matrix products run in bf16, the loss is computed in fp32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from h2.model.transformer import language_model_loss
from heteropp.resharding import PendingTensor, Resharder
from heteropp.tensor_parallel import WeightGradStore
from heteropp.tracing import SpanRecorder, span

COMPUTE_KINDS = ("F", "B", "W")
COMMUNICATION_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass
class _MicroBatchState:
    stage_input: torch.Tensor | None = None
    stage_output: torch.Tensor | None = None  # activation, or the scaled loss on the last stage
    input_grad: torch.Tensor | None = None
    weight_work: list = field(default_factory=list)
    received_input: PendingTensor | None = None
    received_grad: PendingTensor | None = None


class StageExecutor:

    def __init__(self, stage: torch.nn.Module, *, stage_index: int, num_stages: int, resharder: Resharder,
                 store: WeightGradStore | None, activation_shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 prefetch: bool = True, device: torch.device | str = "cpu", recorder: SpanRecorder | None = None,
                 autocast: torch.dtype | None = None):
        """`recorder`: where each action's span goes when the run is traced (heteropp.tracing);
        `autocast`: the dtype the stage's forward computes in (torch.autocast), None for its own."""
        self.stage, self.index, self.num_stages = stage, stage_index, num_stages
        self.recorder = recorder
        self.autocast = autocast
        self.resharder, self.store = resharder, store
        self.activation_shape, self.dtype, self.prefetch = activation_shape, dtype, prefetch
        self.device = torch.device(device)
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1

    def run(self, actions, tokens: list[torch.Tensor], targets: list[torch.Tensor], loss_scale: float) -> torch.Tensor:
        """Execute `actions` on micro-batches `tokens`/`targets`; returns the sum of scaled losses (last stage)."""
        states: dict[int, _MicroBatchState] = {}
        split_backward = any(action.kind == "W" for action in actions)
        if split_backward and self.store is None:
            raise ValueError("a schedule with W actions needs the stage built with a WeightGradStore")
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        posted: set[int] = set()
        for position, action in enumerate(actions):
            if action.stage != self.index:
                raise ValueError(f"stage {self.index} was given an action of stage {action.stage}: {action}")
            state = states.setdefault(action.micro_batch, _MicroBatchState())
            kind = action.kind
            if kind in COMPUTE_KINDS and self.prefetch:
                self._post_receives_until_next_compute(actions, position + 1, states, posted)
            micro_batch = action.micro_batch
            if kind == "F":
                loss = self._forward(state, tokens[micro_batch], targets[micro_batch], loss_scale, micro_batch)
                if loss is not None:
                    loss_sum += loss
            elif kind == "B":
                self._backward(state, split_backward, micro_batch)
            elif kind == "W":
                with span(self.recorder, str(action), "backward-weight", micro_batch=micro_batch):
                    WeightGradStore.run(state.weight_work)
                state.weight_work = []
            elif kind == "SEND_F":
                with span(self.recorder, str(action), "send", micro_batch=micro_batch, to_stage=self.index + 1):
                    self.resharder.send(state.stage_output.detach(), self.index + 1, micro_batch)
            elif kind == "SEND_B":
                with span(self.recorder, str(action), "send", micro_batch=micro_batch, to_stage=self.index - 1):
                    self.resharder.send(state.input_grad, self.index - 1, micro_batch)
                state.input_grad = None
            elif kind in ("RECV_F", "RECV_B"):
                if position not in posted:
                    self._post_receive(action, state)
                    posted.add(position)
            else:
                raise ValueError(f"unknown action kind {kind!r}")
        with span(self.recorder, "wait sends", "send"):
            self.resharder.p2p.wait_sends()
        return loss_sum

    def _post_receives_until_next_compute(self, actions, start: int, states, posted: set[int]) -> None:
        for position in range(start, len(actions)):
            action = actions[position]
            if action.kind in COMPUTE_KINDS:
                return
            if action.kind in ("RECV_F", "RECV_B") and position not in posted:
                self._post_receive(action, states.setdefault(action.micro_batch, _MicroBatchState()))
                posted.add(position)

    def _post_receive(self, action, state: _MicroBatchState) -> None:
        if action.kind == "RECV_F":
            state.received_input = self.resharder.post_recv(self.activation_shape, self.dtype, self.index - 1,
                                                            action.micro_batch, device=self.device)
        else:
            state.received_grad = self.resharder.post_recv(self.activation_shape, self.dtype, self.index + 1,
                                                           action.micro_batch, device=self.device)

    def _forward(self, state: _MicroBatchState, tokens, targets, loss_scale: float, micro_batch: int):
        if self.is_first:
            x = tokens
        else:
            with span(self.recorder, f"RECV_F{micro_batch}", "recv", micro_batch=micro_batch,
                      from_stage=self.index - 1):
                x = state.received_input.wait().requires_grad_()
            state.received_input = None
        with span(self.recorder, f"F{micro_batch}", "forward", micro_batch=micro_batch):
            with self._compute_precision():
                output = self.stage(x)
            state.stage_input = x
            if self.is_last:
                state.stage_output = language_model_loss(output, targets) * loss_scale
                return state.stage_output.detach()
            state.stage_output = output
        return None

    def _compute_precision(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    def _backward(self, state: _MicroBatchState, split_backward: bool, micro_batch: int) -> None:
        if self.is_last:
            grad = None
        else:
            with span(self.recorder, f"RECV_B{micro_batch}", "recv", micro_batch=micro_batch,
                      from_stage=self.index + 1):
                grad = state.received_grad.wait()
            state.received_grad = None
        kind = "backward-input" if split_backward else "backward"
        with span(self.recorder, f"B{micro_batch}", kind, micro_batch=micro_batch):
            if not split_backward:
                torch.autograd.backward(state.stage_output, grad_tensors=grad)
            else:
                self.store.deferring = True
                try:
                    torch.autograd.backward(state.stage_output, grad_tensors=grad)
                finally:
                    self.store.deferring = False
                state.weight_work = self.store.take()
        if not self.is_first:
            state.input_grad = state.stage_input.grad
        state.stage_input = state.stage_output = None
