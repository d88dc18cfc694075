"""Conformance of a vendor's DIOPI kernels: PyTorch's own OpInfo samples for the operators in the
DIOPI table, run on dipu and compared with the CPU under per-dtype tolerances.

This is the check a vendor runs on its chip; with the host vendor it also shows what an emulation
profile changes (a reduced-precision profile must fail exactly the operators it alters).
"""
import os
from dataclasses import dataclass, field

import torch

from ditorch.dipu.errors import DipuError
from ditorch.dipu.fallback import fallback_counts, reset_fallback_counts
from ditorch.dipu.table import TableEntry, diopi_table

DEFAULT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool)


@dataclass
class DtypeResult:
    passed: int = 0
    failed: int = 0
    first_failure: str = ""


@dataclass
class OpResult:
    entry: TableEntry
    opinfo: str
    dtypes: dict = field(default_factory=dict)  # dtype name -> DtypeResult
    fell_back: int = 0                          # fallbacks of this entry's operator during the run

    @property
    def passed(self) -> bool:
        return all(r.failed == 0 for r in self.dtypes.values()) and self.samples > 0

    @property
    def samples(self) -> int:
        return sum(r.passed + r.failed for r in self.dtypes.values())


def load_op_db():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:
        raise DipuError(f"ditorch conformance needs torch's OpInfo database, which failed to import: {exc}") from None
    return op_db


def find_opinfo(op_db, name: str):
    base, _, variant = name.partition(".")
    candidates = [op for op in op_db if op.name == name and op.variant_test_name == ""]
    candidates += [op for op in op_db if op.name == base and op.variant_test_name == variant]
    if not candidates:
        raise DipuError(f"diopi_table.yaml names OpInfo '{name}', which torch {torch.__version__} does not have")
    return candidates[0]


def to_device(value, device: str):
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def compare_sample(op, sample, device: str) -> str:
    """'' when dipu matches the CPU on this sample, else a one-line reason."""
    expected = op(sample.input, *sample.args, **sample.kwargs)
    moved = to_device((sample.input, sample.args, sample.kwargs), device)
    try:
        actual = op(moved[0], *moved[1], **moved[2])
    except Exception as exc:  # an error on dipu where the CPU succeeded is a failure
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
    try:
        torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True, check_device=False)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return "; ".join(lines[:3])
    return ""


def check_entry(op_db, entry: TableEntry, opinfo_name: str, dtypes, max_samples: int, device: str) -> OpResult:
    op = find_opinfo(op_db, opinfo_name)
    result = OpResult(entry=entry, opinfo=opinfo_name)
    supported = op.supported_dtypes("cpu")
    reset_fallback_counts()
    for dtype in dtypes:
        if dtype not in supported:
            continue
        outcome = result.dtypes.setdefault(str(dtype).removeprefix("torch."), DtypeResult())
        torch.manual_seed(0)
        for index, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
            if index >= max_samples:
                break
            reason = compare_sample(op, sample, device)
            if reason:
                outcome.failed += 1
                outcome.first_failure = outcome.first_failure or reason
            else:
                outcome.passed += 1
    aten_key = entry.aten if "." in entry.aten else entry.aten + "."
    result.fell_back = sum(n for name, n in fallback_counts().items() if (name + ".").startswith(f"aten::{aten_key}"))
    return result


def run_conformance(ops=None, dtypes=DEFAULT_DTYPES, max_samples: int = 16, device: str = "dipu") -> list:
    """OpResults for every (table entry, OpInfo name) pair, restricted to `ops` (ATen or OpInfo names)."""
    import ditorch.dipu  # noqa: F401  registers the device

    op_db = load_op_db()
    results = []
    wanted = set(ops) if ops else None
    for entry in diopi_table():
        for opinfo_name in entry.opinfo:
            if wanted is not None and not ({entry.aten, entry.aten.split(".")[0], opinfo_name} & wanted):
                continue
            results.append(check_entry(op_db, entry, opinfo_name, dtypes, max_samples, device))
    if wanted is not None and not results:
        raise DipuError(f"no DIOPI table entry matches {', '.join(sorted(wanted))}")
    return results


def format_result(result: OpResult) -> str:
    status = "PASS" if result.passed else "FAIL"
    per_dtype = ", ".join(f"{name} {r.passed}/{r.passed + r.failed}" for name, r in result.dtypes.items())
    line = f"{status}  {result.opinfo:<24} {result.entry.aten:<28} {result.entry.diopi:<22} [{per_dtype}]"
    if result.fell_back:
        line += f" (fell back {result.fell_back}x)"
    for name, r in result.dtypes.items():
        if r.failed:
            line += f"\n      {name}: {r.first_failure}"
    return line


def profile_name() -> str:
    return os.environ.get("DIPU_HOST_PROFILE") or "default"
