"""Conformance of a vendor's DIOPI kernels: PyTorch's own OpInfo samples for the operators in the
DIOPI table, run on dipu and compared with the CPU under per-dtype tolerances.

This is the check a vendor runs on its chip; with the host vendor it also shows what an emulation
profile changes (a reduced-precision profile fails exactly the operators it alters). A sample
counts for a table entry only if it reached that entry's DIOPI kernel on the device; an entry
none of whose samples reach its kernel fails as untested.
"""
import os
from dataclasses import dataclass, field

import torch

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError
from ditorch.dipu.table import TableEntry, diopi_table

DEFAULT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool)
MODES = ("forward", "inplace", "out", "backward")


class NotApplicable(Exception):
    """The CPU itself rejects this sample in this mode (for example an in-place broadcast)."""


@dataclass
class DtypeResult:
    passed: int = 0
    failed: int = 0
    first_failure: str = ""


@dataclass
class OpResult:
    entry: TableEntry
    check: str
    dtypes: dict = field(default_factory=dict)  # dtype name -> DtypeResult

    @property
    def samples(self) -> int:
        return sum(r.passed + r.failed for r in self.dtypes.values())

    @property
    def passed(self) -> bool:
        return self.samples > 0 and all(r.failed == 0 for r in self.dtypes.values())


def load_op_db():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:
        raise DipuError(f"ditorch conformance needs torch's OpInfo database, which failed to import: {exc}") from None
    return op_db


def find_opinfo(op_db, name: str):
    base, _, variant = name.partition(".")
    for op in op_db:
        if (op.name == name and op.variant_test_name == "") or (op.name == base and op.variant_test_name == variant):
            return op
    raise DipuError(f"diopi_table.yaml names OpInfo '{name}', which torch {torch.__version__} does not have")


def split_check(check: str) -> tuple[str, str]:
    name, _, mode = check.partition(":")
    mode = mode or "forward"
    if mode not in MODES:
        raise DipuError(f"diopi_table.yaml: check '{check}' has unknown mode '{mode}' (one of {', '.join(MODES)})")
    return name, mode


def tensors_in(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def moved(value, device):
    if isinstance(value, torch.Tensor):
        copy = value.detach().to(device)
        return copy.requires_grad_(value.requires_grad) if value.is_floating_point() else copy
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def evaluate(op, mode: str, arguments, seed: int):
    """The tensors to compare for one sample in one mode, computed where `arguments` live."""
    inputs, args, kwargs = arguments
    torch.manual_seed(seed)  # seeds the CPU and every dipu generator alike
    if mode == "forward":
        return op(inputs, *args, **kwargs)
    if mode == "inplace":
        target = inputs.clone()
        op.inplace_variant(target, *args, **kwargs)
        return target
    if mode == "out":
        result = op(inputs, *args, **kwargs)
        out = torch.empty(0, dtype=result.dtype, device=result.device)
        op(inputs, *args, **kwargs, out=out)
        return out
    outputs = [t for t in tensors_in(op(inputs, *args, **kwargs)) if t.requires_grad]
    leaves = [t for t in tensors_in(arguments) if t.requires_grad]
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outputs]
    return torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True)


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def compare(op, sample, mode: str, entry: TableEntry, seed: int):
    """None when the sample does not reach the entry's kernel, '' when it matches, else why not."""
    cpu_arguments = (sample.input, sample.args, sample.kwargs)
    try:
        expected = evaluate(op, mode, cpu_arguments, seed)
    except Exception:
        return None  # the CPU rejects it too: not a sample for this mode
    before = _C._diopi_call_counts().get(f"aten::{entry.aten}", 0)
    try:
        actual = evaluate(op, mode, moved(cpu_arguments, "dipu"), seed)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if _C._diopi_call_counts().get(f"aten::{entry.aten}", 0) == before:
        return None
    try:
        torch.testing.assert_close(to_cpu(actual), to_cpu(expected), equal_nan=True, check_device=False)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return "; ".join(lines[:3])
    return ""


def check_entry(op_db, entry: TableEntry, check: str, dtypes, max_samples: int) -> OpResult:
    name, mode = split_check(check)
    op = find_opinfo(op_db, name)
    allowed = op.supported_backward_dtypes("cpu") if mode == "backward" else op.supported_dtypes("cpu")
    result = OpResult(entry=entry, check=check)
    for dtype in dtypes:
        if dtype not in allowed:
            continue
        outcome = DtypeResult()
        samples = op.sample_inputs("cpu", dtype, requires_grad=(mode == "backward"))
        for seed, sample in enumerate(samples):
            if outcome.passed + outcome.failed >= max_samples:
                break
            reason = compare(op, sample, mode, entry, seed)
            if reason is None:
                continue
            if reason:
                outcome.failed += 1
                outcome.first_failure = outcome.first_failure or reason
            else:
                outcome.passed += 1
        if outcome.passed + outcome.failed:
            result.dtypes[str(dtype).removeprefix("torch.")] = outcome
    return result


def run_conformance(ops=None, dtypes=DEFAULT_DTYPES, max_samples: int = 16) -> list:
    """OpResults for every (table entry, check), restricted to `ops` (ATen names or OpInfo names)."""
    import ditorch.dipu  # noqa: F401  registers the device

    op_db = load_op_db()
    wanted = set(ops) if ops else None
    results = []
    for entry in diopi_table():
        for check in entry.opinfo:
            names = {entry.aten, entry.aten.split(".")[0], check, split_check(check)[0]}
            if wanted is None or names & wanted:
                results.append(check_entry(op_db, entry, check, dtypes, max_samples))
    if wanted is not None and not results:
        raise DipuError(f"no DIOPI table entry matches {', '.join(sorted(wanted))}")
    return results


def format_result(result: OpResult) -> str:
    status = "PASS" if result.passed else "FAIL"
    per_dtype = ", ".join(f"{name} {r.passed}/{r.passed + r.failed}" for name, r in result.dtypes.items())
    line = f"{status}  {result.entry.aten:<54} {result.entry.diopi:<28} {result.check:<44} [{per_dtype}]"
    if result.samples == 0:
        line += f"\n      no sample reached {result.entry.diopi}"
    for name, r in result.dtypes.items():
        if r.failed:
            line += f"\n      {name}: {r.first_failure}"
    return line


def profile_name() -> str:
    return os.environ.get("DIPU_HOST_PROFILE") or "default"
