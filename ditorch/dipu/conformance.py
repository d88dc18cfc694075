"""Conformance of the dipu device: PyTorch's own OpInfo samples (op_db) run on dipu and compared
with the CPU under per-dtype tolerances.

Two sweeps, one mechanism. The table sweep checks every entry of the DIOPI table through the
OpInfo checks the table names for it; a sample counts for an entry only if it reached that entry's
DIOPI kernel on the device, and an entry none of whose samples reach its kernel fails as untested.
The fallback sweep (`fallback=True`) runs every OpInfo of op_db, forward and (where the op has
gradients) backward, and records which path each op took: DIOPI kernels, the CPU fallback, or only
native device kernels (copies, views).

Samples are created on dipu by the OpInfo's own sample functions and copied to the CPU, as
PyTorch's `test_compare_cpu` does. What an emulation profile degrades is read from the profile's
definition (`round_output_ops`, `round_output_mantissa_bits`), and a check is marked `degraded` when
one of its samples reached a rounded DIOPI function in a dtype that the rounding changes; the
profile conforms exactly when the checks that fail are the degraded ones.

Each check runs in a worker process (`python -m ditorch.dipu.conformance --worker`); a check that
kills its worker (a crash in a kernel) is reported as failed with the signal, and a fresh worker
goes on with the next check.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError
from ditorch.dipu.table import TableEntry, diopi_table

DEFAULT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool)
MODES = ("forward", "inplace", "out", "backward")
PROFILE_DIR = Path(_C.__file__).resolve().parent / "host_profiles"


class NotApplicable(Exception):
    """The CPU itself rejects this sample in this mode (for example an in-place broadcast)."""


# ---- what is checked -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    opinfo: str  # OpInfo name, "name" or "name.variant"
    mode: str  # forward | inplace | out | backward
    aten: str | None = None  # the DIOPI table entry it checks (None in the fallback sweep)
    diopi: str | None = None

    @property
    def label(self) -> str:
        return self.opinfo if self.mode == "forward" else f"{self.opinfo}:{self.mode}"


def split_check(check: str) -> tuple[str, str]:
    name, _, mode = check.partition(":")
    mode = mode or "forward"
    if mode not in MODES:
        raise DipuError(f"diopi_table.yaml: check '{check}' has unknown mode '{mode}' (one of {', '.join(MODES)})")
    return name, mode


def opinfo_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def load_op_db():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:
        raise DipuError(f"ditorch conformance needs torch's OpInfo database, which failed to import: {exc}") from None
    return op_db


def find_opinfo(op_db, name: str):
    for op in op_db:
        if opinfo_name(op) == name:
            return op
    raise DipuError(f"no OpInfo named '{name}' in torch {torch.__version__}")


def table_checks(table: list[TableEntry], wanted: set | None = None) -> list[Check]:
    checks = []
    for entry in table:
        for text in entry.opinfo:
            name, mode = split_check(text)
            names = {entry.aten, entry.aten.split(".")[0], text, name}
            if wanted is None or names & wanted:
                checks.append(Check(name, mode, entry.aten, entry.diopi))
    return checks


def fallback_checks(op_db, wanted: set | None = None) -> list[Check]:
    checks = []
    for op in op_db:
        name = opinfo_name(op)
        if wanted is None or {name, op.name} & wanted:
            checks.append(Check(name, "forward"))
            if op.supports_autograd:
                checks.append(Check(name, "backward"))
    return checks


# ---- what the profile degrades -------------------------------------------------------------------
@dataclass(frozen=True)
class Degradation:
    """The DIOPI functions whose floating outputs the emulation profile rounds, and to how many
    mantissa bits (from the profile's definition; empty for the exact profiles and other vendors)."""
    functions: frozenset = frozenset()
    mantissa_bits: int = 52

    def changes(self, dtype: torch.dtype) -> bool:
        if not self.functions or not (dtype.is_floating_point or dtype.is_complex):
            return False
        return mantissa_bits(dtype.to_real()) > self.mantissa_bits


def mantissa_bits(dtype: torch.dtype) -> int:
    return round(-math.log2(torch.finfo(dtype).eps))


def profile_name() -> str:
    return os.environ.get("DIPU_HOST_PROFILE") or "default"


def profile_path(name: str) -> Path:
    is_path = "/" in name or ".yaml" in name
    return Path(name) if is_path else PROFILE_DIR / f"{name}.yaml"


def profile_degradation(name: str | None = None) -> Degradation:
    path = profile_path(name or profile_name())
    try:
        with open(path) as handle:
            profile = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise DipuError(f"{path}: cannot read the emulation profile ({exc.strerror or exc})") from None
    functions = frozenset(profile.get("round_output_ops") or ())
    return Degradation(functions, int(profile.get("round_output_mantissa_bits", 52))) if functions else Degradation()


def rounded_aten_ops(degradation: Degradation, table: list[TableEntry]) -> set[str]:
    """`aten::name.overload` of the table entries whose DIOPI function the profile rounds."""
    return {f"aten::{entry.aten}" for entry in table if entry.diopi in degradation.functions}


# ---- running one check ---------------------------------------------------------------------------
@dataclass
class DtypeResult:
    passed: int = 0
    failed: int = 0
    first_failure: str = ""


@dataclass
class CheckResult:
    check: Check
    dtypes: dict = field(default_factory=dict)  # dtype name -> DtypeResult
    diopi_calls: int = 0  # DIOPI kernel calls made by the compared samples on dipu
    fallback_calls: int = 0  # CPU fallback calls made by them
    # a sample reached a kernel the profile rounds, in a dtype it changes, with a non-empty output
    degraded: bool = False
    not_compared: str = ""  # why no sample was compared (OpInfo declares the output nondeterministic, ...)
    declared: str = ""  # what PyTorch's own compare-with-CPU test declares about the op
    error: str = ""  # the check could not run (a crash, samples that cannot be made on dipu)

    @property
    def samples(self) -> int:
        return sum(r.passed + r.failed for r in self.dtypes.values())

    @property
    def failures(self) -> int:
        return sum(r.failed for r in self.dtypes.values())

    @property
    def status(self) -> str:
        """pass, fail, or skip (nothing compared, and nothing required to be)."""
        if self.error or self.failures:
            return "fail"
        if self.samples:
            return "pass"
        return "fail" if self.check.aten else "skip"

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def path(self) -> str:
        """Which device path the compared samples took ("-" when none ran to the end)."""
        if not self.samples:
            return "-"
        if self.diopi_calls and self.fallback_calls:
            return "diopi+fallback"
        return "diopi" if self.diopi_calls else "fallback" if self.fallback_calls else "native"

    def to_dict(self) -> dict:
        return {
            "opinfo": self.check.opinfo, "mode": self.check.mode, "aten": self.check.aten, "diopi": self.check.diopi,
            "status": self.status, "samples": self.samples, "failures": self.failures, "path": self.path,
            "diopi_calls": self.diopi_calls, "fallback_calls": self.fallback_calls, "degraded": self.degraded,
            "not_compared": self.not_compared, "declared": self.declared, "error": self.error, "dtypes": {
                name: asdict(r) for name, r in self.dtypes.items()
            }
        }

    @classmethod
    def from_dict(cls, data: dict) -> "CheckResult":
        check = Check(data["opinfo"], data["mode"], data["aten"], data["diopi"])
        return cls(check, {name: DtypeResult(**r) for name, r in data["dtypes"].items()}, data["diopi_calls"],
                   data["fallback_calls"], data["degraded"], data["not_compared"], data["declared"], data["error"])


def tensors_in(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().to("cpu")
    return copy.requires_grad_(tensor.requires_grad)


def evaluate(op, mode: str, sample, seed: int):
    """The tensors to compare for one sample in one mode, computed where the sample lives."""
    inputs, args, kwargs = sample.input, sample.args, sample.kwargs
    torch.manual_seed(seed)  # seeds the CPU and every dipu generator alike
    if mode == "forward":
        return sample.output_process_fn_grad(op(inputs, *args, **kwargs))
    if mode == "inplace":
        target = inputs.clone()
        op.inplace_variant(target, *args, **kwargs)
        return target
    if mode == "out":
        result = op(inputs, *args, **kwargs)
        out = torch.empty(0, dtype=result.dtype, device=result.device)
        op(inputs, *args, **kwargs, out=out)
        return out
    outputs = [
        t for t in tensors_in(sample.output_process_fn_grad(op(inputs, *args, **kwargs)))
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    leaves = [t for t in tensors_in((inputs, args, kwargs)) if t.requires_grad]
    if not outputs or not leaves:
        raise NotApplicable
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outputs]
    return torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class Counters:
    """DIOPI and fallback calls made between two points."""

    def __init__(self, aten: str | None, rounded: set[str]):
        self.aten, self.rounded = aten, rounded
        self.diopi, self.fallback = _C._diopi_call_counts(), _C._fallback_counts()

    def since(self):
        diopi, fallback = _C._diopi_call_counts(), _C._fallback_counts()
        delta = {k: v - self.diopi.get(k, 0) for k, v in diopi.items() if v != self.diopi.get(k, 0)}
        fallback_calls = sum(fallback.values()) - sum(self.fallback.values())
        reached_entry = self.aten is None or delta.get(f"aten::{self.aten}", 0) > 0
        rounded_calls = sum(delta.get(name, 0) for name in self.rounded)
        return sum(delta.values()), fallback_calls, reached_entry, rounded_calls


class EmptyRoundedOutputs(TorchDispatchMode):
    """Counts the calls of a rounded operator that produced no element (rounding an empty output
    changes nothing). A dispatch mode sees only the calls made from Python, not those a C++ kernel
    makes (bilinear's bmm inside _trilinear), so a rounded DIOPI call it did not see as empty counts
    as a rounding."""

    def __init__(self, rounded: set[str]):
        super().__init__()
        self.rounded, self.calls = rounded, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        if (name in self.rounded or schema.name in self.rounded) and all(t.numel() == 0 for t in tensors_in(out)):
            self.calls += 1
        return out


def compare(op, sample, mode: str, check: Check, seed: int, rounded: set[str]):
    """(reason or None, diopi calls, fallback calls, reached a rounded kernel): reason is None when
    the sample does not count (the CPU rejects it, or it does not reach the entry's kernel), '' when
    dipu matches the CPU, else what differed."""
    cpu_sample = sample.transform(lambda t: cpu_copy(t) if isinstance(t, torch.Tensor) else t)
    try:
        expected = evaluate(op, mode, cpu_sample, seed)
    except Exception:
        return None, 0, 0, False  # the CPU rejects it too: not a sample for this mode
    counters = Counters(check.aten, rounded)
    empty = EmptyRoundedOutputs(rounded)
    try:
        with empty if rounded else contextlib.nullcontext():
            actual = evaluate(op, mode, sample, seed)
    except Exception as exc:
        diopi, fallback, _, rounded_calls = counters.since()
        return f"raised {first_line(exc)}", diopi, fallback, rounded_calls > empty.calls
    diopi, fallback, reached_entry, rounded_calls = counters.since()
    reached_rounded = rounded_calls > empty.calls
    if not reached_entry:
        return None, 0, 0, False
    try:
        torch.testing.assert_close(to_cpu(actual), to_cpu(expected), equal_nan=True, check_device=False)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return "; ".join(lines[:3]), diopi, fallback, reached_rounded
    return "", diopi, fallback, reached_rounded


def not_compared_reason(op) -> str:
    if op.has_nondeterministic_output:
        return "OpInfo declares its output nondeterministic (uninitialized memory)"
    return ""


def declared_by_pytorch(op) -> str:
    """What PyTorch's own device-against-CPU test (TestCommon.test_compare_cpu) declares about this
    op for a device other than cuda and cpu: an expected failure or a skip, with its reason."""
    for info in op.decorators:
        if getattr(info, "test_name", None) != "test_compare_cpu" or info.device_type not in (None, "privateuse1"):
            continue
        decorators = info.decorators if isinstance(info.decorators, (list, tuple)) else [info.decorators]
        for decorator in decorators:
            if getattr(decorator, "__name__", "") == "expectedFailure":
                return "PyTorch's test_compare_cpu expects it to fail on every device"
            reasons = [
                cell.cell_contents for cell in getattr(decorator, "__closure__", None) or ()
                if isinstance(cell.cell_contents, str)
            ]
            if reasons:
                return f"PyTorch's test_compare_cpu skips it ({reasons[0]})"
    return ""


def run_check(op_db, check: Check, dtypes, max_samples: int, degradation: Degradation,
              rounded: set[str]) -> CheckResult:
    op = find_opinfo(op_db, check.opinfo)
    result = CheckResult(check, declared=declared_by_pytorch(op))
    result.not_compared = not_compared_reason(op)
    if result.not_compared:
        return result
    if check.mode == "backward" and not op.supports_autograd:
        result.not_compared = "OpInfo has no gradients"
        return result
    allowed = op.supported_backward_dtypes("cpu") if check.mode == "backward" else op.supported_dtypes("cpu")
    for dtype in dtypes:
        if dtype not in allowed:
            continue
        outcome = DtypeResult()
        samples = iter(op.sample_inputs("dipu", dtype, requires_grad=(check.mode == "backward")))
        for seed in range(10_000):
            if outcome.passed + outcome.failed >= max_samples:
                break
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as exc:  # the OpInfo's sample function itself fails on dipu
                name = str(dtype).removeprefix("torch.")
                result.error = result.error or f"cannot make {name} samples on dipu: {first_line(exc)}"
                break
            reason, diopi, fallback, reached_rounded = compare(op, sample, check.mode, check, seed, rounded)
            if reason is None:
                continue
            result.diopi_calls += diopi
            result.fallback_calls += fallback
            result.degraded |= reached_rounded and degradation.changes(dtype)
            if reason:
                outcome.failed += 1
                outcome.first_failure = outcome.first_failure or reason
            else:
                outcome.passed += 1
        if outcome.passed + outcome.failed:
            result.dtypes[str(dtype).removeprefix("torch.")] = outcome
    if not result.samples and not result.error:
        if check.aten:
            result.error = f"no sample reached {check.diopi}"
        elif not any(dtype in allowed for dtype in dtypes):
            result.not_compared = "no OpInfo sample in the requested dtypes"
        else:
            result.not_compared = f"the CPU rejects every sample in {check.mode} mode"
    return result


def run_checks(checks: list[Check], dtypes=DEFAULT_DTYPES, max_samples: int = 16) -> list[CheckResult]:
    """Run the checks in this process (a crash in a kernel ends it; `run_isolated` survives that)."""
    import ditorch.dipu  # noqa: F401  registers the device

    op_db = load_op_db()
    degradation = profile_degradation() if _is_host_vendor() else Degradation()
    rounded = rounded_aten_ops(degradation, diopi_table())
    return [run_check(op_db, check, dtypes, max_samples, degradation, rounded) for check in checks]


def _is_host_vendor() -> bool:
    return _C._vendor_name() == "host"


def run_conformance(ops=None, dtypes=DEFAULT_DTYPES, max_samples: int = 16) -> list[CheckResult]:
    """The table sweep in this process, restricted to `ops` (ATen names or OpInfo names)."""
    wanted = set(ops) if ops else None
    checks = table_checks(diopi_table(), wanted)
    if wanted is not None and not checks:
        raise DipuError(f"no DIOPI table entry matches {', '.join(sorted(wanted))}")
    return run_checks(checks, dtypes, max_samples)


# ---- worker processes ----------------------------------------------------------------------------
def _worker_main() -> int:
    torch.set_num_threads(1)
    job = json.loads(sys.stdin.read())
    dtypes = tuple(getattr(torch, name) for name in job["dtypes"])
    import ditorch.dipu  # noqa: F401

    op_db = load_op_db()
    degradation = profile_degradation() if _is_host_vendor() else Degradation()
    rounded = rounded_aten_ops(degradation, diopi_table())
    for fields in job["checks"]:
        check = Check(*fields)
        try:
            result = run_check(op_db, check, dtypes, job["max_samples"], degradation, rounded)
        except Exception as exc:
            result = CheckResult(check, error=first_line(exc))
        print(json.dumps(result.to_dict()), flush=True)
    return 0


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"exit status {returncode}"


WORKER = (sys.executable, "-W", "ignore", "-m", "ditorch.dipu.conformance", "--worker")
CHECK_TIMEOUT_S = 600.0


def run_isolated(checks: list[Check], dtypes=DEFAULT_DTYPES, max_samples: int = 16, progress=None, worker=WORKER,
                 timeout: float = CHECK_TIMEOUT_S) -> list[CheckResult]:
    """Run the checks in worker processes (same vendor and profile, from the environment); a check
    that kills its worker, or runs longer than `timeout` seconds, is a failed result saying so, and
    the rest go on in a new worker. `progress(done, total, result)` is called after each check."""
    results: list[CheckResult] = []
    while len(results) < len(checks):
        remaining = checks[len(results):]
        job = {
            "checks": [[c.opinfo, c.mode, c.aten, c.diopi]
                       for c in remaining], "dtypes": [str(d).removeprefix("torch.")
                                                       for d in dtypes], "max_samples": max_samples
        }
        with tempfile.TemporaryFile("w+") as errors:  # a file, so a chatty worker never blocks on it
            process = subprocess.Popen(list(worker), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                       text=True)
            process.stdin.write(json.dumps(job))
            process.stdin.close()
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: [lines.put(line)
                                             for line in process.stdout] + [lines.put(None)], daemon=True).start()
            started, timed_out = len(results), False
            while True:
                try:
                    line = lines.get(timeout=timeout)
                except queue.Empty:
                    timed_out = True
                    process.kill()
                    break
                if line is None:
                    break
                results.append(CheckResult.from_dict(json.loads(line)))
                if progress:
                    progress(len(results), len(checks), results[-1])
            returncode = process.wait()
            errors.seek(0)
            stderr = errors.read()
        if len(results) < len(checks):
            if not timed_out and returncode >= 0 and len(results) == started:  # died before its first check
                raise DipuError(
                    f"conformance worker failed: {stderr.strip().splitlines()[-1] if stderr.strip() else returncode}")
            why = f"ran longer than {timeout:g} s" if timed_out else f"crashed the process ({_signal_name(returncode)})"
            results.append(CheckResult(checks[len(results)], error=why))
            if progress:
                progress(len(results), len(checks), results[-1])
    return results


# ---- reports -------------------------------------------------------------------------------------
def format_result(result: CheckResult) -> str:
    check = result.check
    status = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[result.status]
    per_dtype = ", ".join(f"{name} {r.passed}/{r.passed + r.failed}" for name, r in result.dtypes.items())
    if check.aten:
        line = f"{status}  {check.aten:<54} {check.diopi:<28} {check.label:<44} [{per_dtype}]"
    else:
        line = f"{status}  {check.label:<54} {result.path:<16} [{per_dtype}]"
    if result.degraded:
        line += "  (degraded by the profile)"
    for text in (result.error, result.not_compared):
        if text:
            line += f"\n      {text}"
    for name, r in result.dtypes.items():
        if r.failed:
            line += f"\n      {name}: {r.first_failure}"
    return line


def known_difference(result: CheckResult, degradation: Degradation) -> str:
    """Why a check did not pass, in a table cell."""
    if result.status == "pass":
        return ""
    if result.degraded and result.failures:
        why = (f"the profile rounds {', '.join(sorted(degradation.functions))} outputs to "
               f"{degradation.mantissa_bits} mantissa bits")
    elif result.not_compared:
        why = f"not compared: {result.not_compared}"
    elif result.error:
        why = result.error
    else:
        name, r = next((n, r) for n, r in result.dtypes.items() if r.failed)
        why = f"{name}: {r.first_failure}"
    return f"{why} ({result.declared})" if result.declared else why


def summary(results: list[CheckResult]) -> dict:
    failed = [r for r in results if r.status == "fail"]
    degraded = [r for r in results if r.degraded]
    return {
        "checks": len(results), "passed": sum(r.status == "pass" for r in results), "failed": len(failed),
        "skipped": sum(r.status == "skip"
                       for r in results), "samples": sum(r.samples for r in results), "failed_checks": [
                           r.check.label for r in failed
                       ], "degraded_checks": [r.check.label for r in degraded], "fails_exactly_the_degraded": {
                           r.check.label for r in failed
                       } == {r.check.label for r in degraded}
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(results: list[CheckResult], degradation: Degradation) -> str:
    """The table sweep as one row per check; the fallback sweep as totals per path and one row per
    check that did not pass."""
    lines = []
    table = [r for r in results if r.check.aten]
    sweep = [r for r in results if not r.check.aten]
    if table:
        lines += [
            "| ATen operator | DIOPI function | OpInfo check | samples | pass | known difference |",
            "|---|---|---|---|---|---|"
        ]
        for r in table:
            lines.append(f"| `{r.check.aten}` | `{r.check.diopi}` | `{r.check.label}` | {r.samples} | "
                         f"{r.samples - r.failures} | {_cell(known_difference(r, degradation))} |")
    if sweep:
        if lines:
            lines.append("")
        lines += ["| path taken on dipu | checks | samples | pass | fail | not compared |", "|---|---|---|---|---|---|"]
        for path in ("fallback", "diopi+fallback", "diopi", "native", "-"):
            group = [r for r in sweep if r.path == path]
            label = "no sample ran to the end" if path == "-" else path
            lines.append(f"| {label} | {len(group)} | {sum(r.samples for r in group)} | "
                         f"{sum(r.status == 'pass' for r in group)} | {sum(r.status == 'fail' for r in group)} | "
                         f"{sum(r.status == 'skip' for r in group)} |")
        lines += ["", "| OpInfo check | path | samples | pass | known difference |", "|---|---|---|---|---|"]
        for r in sweep:
            if r.status != "pass":
                lines.append(f"| `{r.check.label}` | {r.path} | {r.samples} | {r.samples - r.failures} | "
                             f"{_cell(known_difference(r, degradation))} |")
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(_worker_main())
