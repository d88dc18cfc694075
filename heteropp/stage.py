"""One pipeline stage cut from the h2 model: its contiguous decoder layers, the embedding on the first
stage, the final norm and output head on the last; plus activation recompute applied from outside.

The stage is taken from a full `Transformer` built with the run's seed, so its weights are exactly
that model's (tensor parallelism then keeps this rank's shard of them, see tensor_parallel).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from h2.model.transformer import Transformer
from heteropp.tracing import SpanRecorder, span


class PipelineStage(nn.Module):
    """Maps tokens [b, s] (first stage) or hidden states [b, s, h] to hidden states, or logits (last)."""

    def __init__(self, model: Transformer, layers: range, *, first: bool, last: bool):
        super().__init__()
        self.embed = model.embed if first else None
        self.layers = nn.ModuleList(model.layers[i] for i in layers)
        self.norm = model.norm if last else None
        self.head = model.head if last else None
        self.is_first, self.is_last = first, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def build_stage(model: Transformer, layers: range, *, first: bool, last: bool) -> PipelineStage:
    return PipelineStage(model, layers, first=first, last=last)


class RecomputedLayer(nn.Module):
    """Keeps only its input for backward and re-runs the layer's forward when the gradient arrives
    (a span of kind recompute on `recorder`, when the run is traced)."""

    wraps = "layer"  # the model's layer; it stands where this one does (heteropp.stage_parameters)

    def __init__(self, layer: nn.Module, recorder: SpanRecorder | None = None):
        super().__init__()
        self.layer = layer
        self.recorder = recorder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recorder is None:
            return checkpoint(self.layer, x, use_reentrant=False)
        runs = 0

        def run(inputs: torch.Tensor) -> torch.Tensor:
            nonlocal runs
            runs += 1
            if runs == 1:
                return self.layer(inputs)
            with span(self.recorder, "recompute", "recompute"):
                return self.layer(inputs)

        return checkpoint(run, x, use_reentrant=False)


def apply_recompute(stage: PipelineStage, recorder: SpanRecorder | None = None) -> PipelineStage:
    """Wrap every decoder layer of the stage in activation recompute (in place); returns the stage."""
    stage.layers = nn.ModuleList(RecomputedLayer(layer, recorder) for layer in stage.layers)
    return stage
