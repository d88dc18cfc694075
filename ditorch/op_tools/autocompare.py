"""Autocompare: every selected op call also runs on a CPU reference with copies of its inputs
(half-precision inputs of precision-sensitive ops upcast to float32), and each output, forward
and backward, is compared with the reference's. One CSV row per call; the first call beyond
tolerance is reported with its module path."""

from __future__ import annotations

import math
import re
from typing import TextIO

import torch

from ditorch.op_tools.compare import Comparison, Tolerances, compare_tensors
from ditorch.op_tools.converted_call import written_arguments
from ditorch.op_tools.op_filter import name_forms
from ditorch.op_tools.tensors import (
    STDERR,
    CsvRows,
    copy_to,
    describe_tensors,
    hidden,
    map_devices,
    map_tensors,
    tensors_of,
)
from ditorch.op_tools.tool import OpCall, OpTool, is_random, returns_alias

# Ops whose result depends on accumulation order or intermediate precision.
PRECISION_SENSITIVE = re.compile(
    r"^(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|convolution.*|_convolution.*|conv.*|.*softmax.*|sum|mean|var|std|"
    r"var_mean|std_mean|norm|linalg_vector_norm|cumsum|cumprod|prod|logsumexp|.*attention.*|native_layer_norm.*|"
    r"native_group_norm.*|native_batch_norm.*|_fused_rms_norm.*|nll_loss.*|cross_entropy.*|dot|vdot|mv|addmv|"
    r"addr|einsum|_weight_norm.*)$")
DEFAULT_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
# Ops that compute nothing to compare, or whose outputs are undefined.
NOT_COMPARED = {
    "_local_scalar_dense", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_",
    "resize_as_", "record_stream", "_has_compatible_shallow_copy_type"
}

CSV_FIELDS = [
    "index", "op", "phase", "module", "inputs", "outputs", "reference", "max_abs", "max_rel", "cosine", "rtol", "atol",
    "allclose", "status"
]


def _packet(func) -> str:
    return func._schema.name.split("::", 1)[-1]


class OpAutoCompare(OpTool):
    """Compare each selected op with a CPU reference run.

    csv_path: one row per compared call. tolerances: a Tolerances (per-op and per-dtype overrides).
    upcast: dtype promotions applied to the reference's inputs for precision-sensitive ops
    (default float16/bfloat16 -> float32; pass {torch.float32: torch.float64} to also widen float32).
    raise_on_mismatch: raise AssertionError at the first call beyond tolerance.
    """

    tool_name = "autocompare"

    def __init__(self, ops=None, *, csv_path: str | None = None, tolerances: Tolerances | None = None,
                 upcast: dict | None = None, reference_device: str = "cpu", raise_on_mismatch: bool = False,
                 report: TextIO | None = STDERR, **filters):
        super().__init__(ops, **filters)
        self.csv_path = csv_path
        self.tolerances = tolerances or Tolerances()
        self.upcast = DEFAULT_UPCAST if upcast is None else dict(upcast)
        self.reference_device = torch.device(reference_device)
        self.raise_on_mismatch = raise_on_mismatch
        self.report = report
        self.log = CsvRows(csv_path, CSV_FIELDS)
        self.rows = self.log.rows
        self.first_mismatch: dict | None = None

    def on_start(self) -> None:
        self.log.open()

    def on_stop(self) -> None:
        self.log.close()
        if self.report is not None:
            print(self.summary(), file=self.report)

    @property
    def mismatches(self) -> list[dict]:
        return [row for row in self.rows if row["status"].startswith("mismatch")]

    def summary(self) -> str:
        compared = sum(1 for row in self.rows if row["status"].startswith(("ok", "mismatch")))
        failed = self.mismatches
        text = (f"autocompare: {compared} op calls compared with {self.reference_device.type}, "
                f"{len(failed)} beyond tolerance")
        if failed:
            counts: dict[str, int] = {}
            for row in failed:
                counts[f"{row['op']} {row['phase']}"] = counts.get(f"{row['op']} {row['phase']}", 0) + 1
            first = self.first_mismatch
            text += (
                " (" + ", ".join(f"{op} x{n}" for op, n in counts.items()) + ")"
                f"\n  first: call {first['index']} {first['op']} ({first['phase']}) in "
                f"{first['module'] or '<no module>'}: max abs {first['max_abs']:.3g}, max rel "
                f"{first['max_rel']:.3g}, cosine {first['cosine']:.8f} (rtol {first['rtol']:g}, atol {first['atol']:g})"
            )
        errors = [row for row in self.rows if row["status"].startswith("reference failed")]
        if errors:
            text += f"\n  {len(errors)} calls could not run on the reference (see status column)"
        if self.csv_path:
            text += f"\n  csv {self.csv_path}"
        return text

    # ------------------------------------------------------------------------------------------
    def _skipped(self, call: OpCall) -> bool:
        func = call.func
        return (_packet(func) in NOT_COMPARED or returns_alias(func) or is_random(func, call.args, call.kwargs)
                or not call.tensors)

    def _reference_inputs(self, call: OpCall):
        promote = self.upcast if PRECISION_SENSITIVE.match(_packet(call.func)) else {}

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            return copy_to(tensor, self.reference_device, promote.get(tensor.dtype))

        args, kwargs = map_tensors(copy, (call.args, call.kwargs))
        args, kwargs = map_devices((args, kwargs), self.reference_device)
        upcast = sorted({
            f"{t.dtype}->{promote[t.dtype]}".replace("torch.", "") for t in call.tensors if t.dtype in promote
        })
        return args, kwargs, upcast

    def handle(self, call: OpCall):
        if self._skipped(call):
            return call.run()
        ref_args, ref_kwargs, upcast = self._reference_inputs(call)
        out = call.run()
        row = {
            "index": call.index, "op": call.name, "phase": call.phase, "module": call.module,
            "inputs": describe_tensors((call.args, call.kwargs)), "outputs": describe_tensors(out),
            "reference": self.reference_device.type + (" " + " ".join(upcast) if upcast else "")
        }
        try:
            with hidden():
                expected = call.func(*ref_args, **ref_kwargs)
        except Exception as error:  # the reference backend lacks the op or the dtype
            self._record(row, None, f"reference failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            return out
        actual_list, expected_list = tensors_of(out), tensors_of(expected)
        if not actual_list:  # in-place ops that return nothing (_foreach_add_): compare what they wrote
            written = written_arguments(call, ref_args, ref_kwargs)
            actual_list, expected_list = [w[0] for w in written], [w[1] for w in written]
        self._record(row, self._compare(call, actual_list, expected_list), None)
        return out

    def _compare(self, call: OpCall, actual_list: list, expected_list: list) -> Comparison | None:
        if len(actual_list) != len(expected_list):
            return Comparison(math.inf, math.inf, math.nan, False, 0.0, 0.0,
                              f"{len(actual_list)} outputs vs reference {len(expected_list)}")
        names = name_forms(call.func)
        worst = None
        for actual, reference in zip(actual_list, expected_list):
            rtol, atol = self.tolerances.lookup(names, actual.dtype)
            result = compare_tensors(actual, reference, rtol, atol)
            if worst is None or result.worse_than(worst):
                worst = result
        return worst

    def _record(self, row: dict, result: Comparison | None, error: str | None) -> None:
        if result is None:
            row.update(max_abs=math.nan, max_rel=math.nan, cosine=math.nan, rtol="", atol="", allclose="", status=error
                       or "no tensor outputs")
        else:
            row.update(max_abs=result.max_abs, max_rel=result.max_rel, cosine=result.cosine, rtol=result.rtol,
                       atol=result.atol, allclose=result.allclose, status="ok" if result.allclose else "mismatch")
            if result.note:
                row["status"] += f": {result.note}"
        self.log.append(row)
        if row["status"].startswith("mismatch") and self.first_mismatch is None:
            self.first_mismatch = row
            if self.raise_on_mismatch:
                raise AssertionError(f"autocompare: {row['op']} ({row['phase']}) in {row['module'] or '<no module>'} "
                                     f"differs from the {self.reference_device.type} reference: max rel "
                                     f"{row['max_rel']:.3g}, max abs {row['max_abs']:.3g}")
