"""Replay (`ditorch replay DIR --device X`): rerun op calls saved by the capture tool on a device and
compare each output with the saved one. `run_replay` returns 0 when all match, 1 when some do not;
bad input raises UserError."""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from ditorch.op_tools.capture import CALL_FILE, FORMAT_VERSION, META_FILE, decode_leaves
from ditorch.op_tools.compare import Comparison, Tolerances, compare_tensors
from ditorch.op_tools.op_filter import name_forms
from ditorch.op_tools.tensors import map_devices, map_tensors, tensors_of
from h2.core.devices import resolve_device
from h2.core.errors import UserError


@dataclasses.dataclass
class ReplayResult:
    folder: str
    op: str
    phase: str
    module: str
    comparison: Comparison | None
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.comparison is not None and self.comparison.allclose


def call_folders(path: str) -> list[str]:
    """The captured call folders under path (path itself when it is one), in capture order."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such folder")
    if os.path.isfile(os.path.join(path, META_FILE)):
        return [path]
    folders = sorted(
        os.path.join(path, name) for name in os.listdir(path) if os.path.isfile(os.path.join(path, name, META_FILE)))
    if not folders:
        raise UserError(f"{path}: holds no captured op calls (no */{META_FILE})")
    return folders


def resolve_op(name: str, where: str):
    parts = name.split(".")
    if len(parts) != 3:
        raise UserError(f"{where}: field 'op': expected namespace.op.overload, got {name!r}")
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        raise UserError(f"{where}: field 'op': no operator {name} in this torch {torch.__version__}") from None


def load_call(folder: str) -> tuple[dict, dict]:
    meta_path = os.path.join(folder, META_FILE)
    try:
        with open(meta_path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"{meta_path}: cannot read ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or "op" not in meta:
        raise UserError(f"{meta_path}: not a capture of format {FORMAT_VERSION} (fields 'format', 'op')")
    call_path = os.path.join(folder, CALL_FILE)
    try:
        saved = decode_leaves(torch.load(call_path, map_location="cpu", weights_only=True))
    except Exception as error:  # torch.load raises many kinds for a damaged file
        raise UserError(
            f"{call_path}: cannot load ({type(error).__name__}: {str(error).splitlines()[0][:160]})") from None
    if not isinstance(saved, dict) or not {"args", "kwargs", "outputs"} <= set(saved):
        raise UserError(f"{call_path}: expected a dict with 'args', 'kwargs' and 'outputs'")
    return meta, saved


def replay_call(folder: str, device: torch.device, tolerances: Tolerances) -> ReplayResult:
    meta, saved = load_call(folder)
    func = resolve_op(meta["op"], os.path.join(folder, META_FILE))
    args, kwargs = map_devices(map_tensors(lambda t: t.to(device), (saved["args"], saved["kwargs"])), device)
    result = ReplayResult(folder, meta["op"], meta.get("phase", ""), meta.get("module", ""), None)
    try:
        out = func(*args, **kwargs)
    except Exception as error:
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return result
    actual, expected = tensors_of(out), tensors_of(saved["outputs"])
    if len(actual) != len(expected):
        result.error = f"{len(actual)} outputs, capture has {len(expected)}"
        return result
    names = name_forms(func)
    for a, e in zip(actual, expected):
        comparison = compare_tensors(a, e, *tolerances.lookup(names, e.dtype))
        if result.comparison is None or comparison.worse_than(result.comparison):
            result.comparison = comparison
    if result.comparison is None:
        result.comparison = Comparison(0.0, 0.0, 1.0, True, 0.0, 0.0, "no tensor outputs")
    return result


def format_results(results: list[ReplayResult], device: torch.device) -> str:
    lines = [f"{'call':<36} {'op':<40} {'max abs':>10} {'max rel':>10} {'cosine':>12}  result"]
    for r in results:
        name = os.path.basename(r.folder.rstrip(os.sep))
        if r.comparison is None:
            lines.append(f"{name:<36} {r.op:<40} {'':>10} {'':>10} {'':>12}  error: {r.error}")
        else:
            c = r.comparison
            lines.append(f"{name:<36} {r.op:<40} {c.max_abs:>10.3g} {c.max_rel:>10.3g} {c.cosine:>12.8f}  "
                         f"{'ok' if c.allclose else f'MISMATCH (rtol {c.rtol:g}, atol {c.atol:g})'}")
    failed = [r for r in results if not r.passed]
    lines.append(f"replayed {len(results)} op calls on {device}: {len(results) - len(failed)} match, "
                 f"{len(failed)} differ or failed")
    return "\n".join(lines)


def run_replay(capture: str, device_name: str = "cpu", rtol: float | None = None, atol: float | None = None) -> int:
    """Replay every call under `capture` on `device_name` and print the table; 0 when all match, else 1."""
    if (rtol is None) != (atol is None):
        raise UserError("--rtol and --atol go together")
    folders = call_folders(capture)
    device = resolve_device(device_name)
    tolerances = Tolerances()
    if rtol is not None:
        if rtol < 0 or atol < 0:
            raise UserError("--rtol and --atol must not be negative")
        tolerances = Tolerances(per_dtype={dtype: (rtol, atol) for dtype in tolerances.per_dtype})
    results = [replay_call(folder, device, tolerances) for folder in folders]
    print(format_results(results, device))
    return 0 if all(r.passed for r in results) else 1
