"""Module-level compare: one training step (forward, loss, backward) of the same model, with the
same weights and inputs, on a reference and a candidate device; every module's outputs, the
gradients flowing into them, and the parameter gradients are compared, and the first module that
diverges beyond tolerance is named."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Callable, ContextManager

import torch

from ditorch.op_tools.compare import Comparison, Tolerances, compare_tensors
from ditorch.op_tools.tensors import tensors_of

# Looser than the op-level defaults: a module's output carries the error of all its ops.
MODULE_TOLERANCES = {
    torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-3),
    torch.float16: (1e-3, 1e-4)
}


@dataclasses.dataclass(frozen=True)
class ModuleDiff:
    module: str
    kind: str  # 'output', 'output grad' or 'param grad'
    call: int  # which call of the module (a module may run several times in a step)
    comparison: Comparison

    @property
    def passed(self) -> bool:
        return self.comparison.allclose

    def describe(self) -> str:
        c = self.comparison
        call = f" (call {self.call})" if self.call else ""
        return (f"{self.module}{call} {self.kind}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}, "
                f"cosine {c.cosine:.8f} (rtol {c.rtol:g}, atol {c.atol:g}){'' if c.allclose else ' DIVERGES'}")


@dataclasses.dataclass
class ModuleCompareReport:
    reference_device: str
    candidate_device: str
    reference_loss: float
    candidate_loss: float
    forward: list[ModuleDiff]  # module outputs in execution order
    backward: list[ModuleDiff]  # gradients of module outputs in the order backward produced them
    parameters: list[ModuleDiff]  # parameter gradients

    @property
    def first_divergence(self) -> ModuleDiff | None:
        """The first module output beyond tolerance in forward order; else the first gradient in backward order."""
        for diffs in (self.forward, self.backward, self.parameters):
            for diff in diffs:
                if not diff.passed:
                    return diff
        return None

    def format(self, limit: int = 10) -> str:
        lines = [
            f"module compare: {self.candidate_device} against {self.reference_device}; loss "
            f"{self.candidate_loss:.6f} vs {self.reference_loss:.6f}; {len(self.forward)} module outputs, "
            f"{len(self.backward)} output gradients, {len(self.parameters)} parameter gradients compared"
        ]
        first = self.first_divergence
        lines.append(f"first divergence: {first.describe()}" if first else "no module diverges beyond tolerance")
        for title, diffs in (("forward", self.forward), ("backward", self.backward), ("parameters", self.parameters)):
            failing = [d for d in diffs if not d.passed]
            if failing:
                lines.append(f"{title}: {len(failing)} beyond tolerance")
                lines += [f"  {d.describe()}" for d in failing[:limit]]
        return "\n".join(lines)


@dataclasses.dataclass
class _StepRecord:
    loss: float
    outputs: dict  # (path, call, index) -> tensor, in execution order
    output_grads: dict  # (path, call, index) -> tensor, in the order they were produced
    param_grads: dict  # parameter path -> tensor


def _record_step(model: torch.nn.Module, inputs: tuple, targets, loss_fn, device: torch.device,
                 context: ContextManager) -> _StepRecord:
    root = type(model).__name__
    outputs, output_grads, calls = {}, {}, {}
    handles = []

    def keep(store, key):

        def hook(grad):
            store[key] = grad.detach().to("cpu", copy=True)

        return hook

    def forward_hook(path):

        def hook(module, args, output):
            call = calls[path] = calls.get(path, -1) + 1
            for index, tensor in enumerate(tensors_of(output)):
                key = (path, call, index)
                outputs[key] = tensor.detach().to("cpu", copy=True)
                if tensor.requires_grad:
                    tensor.register_hook(keep(output_grads, key))

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(forward_hook(f"{root}.{name}" if name else root)))
    moved = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    target = targets.to(device) if isinstance(targets, torch.Tensor) else targets
    try:
        with context:
            output = model(*moved)
            loss = loss_fn(output, target) if loss_fn is not None else output.float().sum()
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    grads = {
        f"{root}.{name}": p.grad.detach().to("cpu", copy=True) for name, p in model.named_parameters()
        if p.grad is not None
    }
    return _StepRecord(float(loss.detach().to("cpu")), outputs, output_grads, grads)


def _diffs(reference: dict, candidate: dict, kind: str, tolerances: Tolerances) -> list[ModuleDiff]:
    diffs = []
    for key, expected in reference.items():
        actual = candidate.get(key)
        path, call = (key[0], key[1]) if isinstance(key, tuple) else (key, 0)
        if actual is None:
            comparison = Comparison(float("inf"), float("inf"), float("nan"), False, 0.0, 0.0,
                                    "missing on the candidate")
        else:
            comparison = compare_tensors(actual, expected, *tolerances.lookup((), expected.dtype))
        diffs.append(ModuleDiff(path, kind, call, comparison))
    return diffs


def compare_module_step(model: torch.nn.Module, inputs: tuple, *, candidate_device: str | torch.device,
                        reference_device: str | torch.device = "cpu", targets=None, loss_fn: Callable | None = None,
                        tolerances: Tolerances | None = None,
                        candidate_context: Callable[[], ContextManager] | None = None,
                        reference_context: Callable[[], ContextManager] | None = None) -> ModuleCompareReport:
    """Run model(*inputs), loss_fn(output, targets) (default: output.sum()) and backward on copies of
    `model` on both devices. The contexts, if given, are entered around each device's step (for
    example an op tool that emulates a chip on the candidate). The model itself is not changed."""
    tolerances = tolerances or Tolerances(per_dtype=MODULE_TOLERANCES)
    reference_device, candidate_device = torch.device(reference_device), torch.device(candidate_device)
    records = []
    for device, context in ((reference_device, reference_context), (candidate_device, candidate_context)):
        replica = copy.deepcopy(model).to(device)
        replica.zero_grad(set_to_none=True)
        records.append(
            _record_step(replica, tuple(inputs), targets, loss_fn, device,
                         context() if context else contextlib.nullcontext()))
    reference, candidate = records
    return ModuleCompareReport(
        str(reference_device), str(candidate_device), reference.loss, candidate.loss, forward=_diffs(
            reference.outputs, candidate.outputs, "output", tolerances), backward=_diffs(
                reference.output_grads, candidate.output_grads, "output grad", tolerances), parameters=_diffs(
                    reference.param_grads, candidate.param_grads, "param grad", tolerances))
