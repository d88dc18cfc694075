"""Capture: save the inputs and outputs of selected op calls (forward and backward, so gradients
are saved as the inputs and outputs of backward ops) for offline replay.

Each call becomes a folder DIR/NNNNNN_<op>_<phase>/ holding call.pt (arguments and outputs, tensors
on the CPU) and meta.json (op, phase, module path, device, shapes and dtypes). Replay it with
`ditorch replay DIR --device X` (python -m ditorch.op_tools.replay).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from typing import TextIO

import torch
from torch.utils._pytree import tree_map

from ditorch.op_tools.tensors import STDERR, copy_to, describe_tensors, device_of, map_tensors
from ditorch.op_tools.tool import OpCall, OpTool, is_random, returns_alias

FORMAT_VERSION = 1
CALL_FILE = "call.pt"
META_FILE = "meta.json"
# torch.memory_format values cannot be pickled: they are saved by name.
MEMORY_FORMATS = {
    str(fmt).replace("torch.", ""): fmt
    for fmt in (torch.contiguous_format, torch.preserve_format, torch.channels_last, torch.channels_last_3d)
}
_FORMAT_TAG = "__torch_memory_format__"


def encode_leaves(value):
    return tree_map(lambda v: {_FORMAT_TAG: str(v).replace("torch.", "")}
                    if isinstance(v, torch.memory_format) else v, value)


def decode_leaves(value):

    def decode(v):
        if isinstance(v, dict) and set(v) == {_FORMAT_TAG}:
            return MEMORY_FORMATS[v[_FORMAT_TAG]]
        return v

    return tree_map(decode, value, is_leaf=lambda v: isinstance(v, dict) and set(v) == {_FORMAT_TAG})


class OpCapture(OpTool):
    """out_dir: where call folders go. max_calls: stop saving after this many (default no limit).
    Views (they compute nothing) and random ops (a replay cannot reproduce them) are not captured."""

    tool_name = "capture"

    def __init__(self, out_dir: str, ops=None, *, max_calls: int | None = None, report: TextIO | None = STDERR,
                 **filters):
        super().__init__(ops, **filters)
        self.out_dir = out_dir
        self.max_calls = max_calls
        self.report = report
        self.saved: list[str] = []
        self.unsaved: dict[str, str] = {}  # op -> why its calls could not be saved

    def on_start(self) -> None:
        os.makedirs(self.out_dir, exist_ok=True)

    def handle(self, call: OpCall):
        if (returns_alias(call.func) or is_random(call.func, call.args, call.kwargs)
                or (self.max_calls is not None and len(self.saved) >= self.max_calls)):
            return call.run()
        inputs = map_tensors(lambda t: copy_to(t, "cpu"), (call.args, call.kwargs))
        out = call.run()
        outputs = map_tensors(lambda t: copy_to(t, "cpu"), out)
        packet = call.func._schema.name.split("::", 1)[-1]
        folder = os.path.join(self.out_dir, f"{call.index:06d}_{packet}_{call.phase}")
        os.makedirs(folder, exist_ok=True)
        try:
            torch.save(encode_leaves({"args": inputs[0], "kwargs": inputs[1], "outputs": outputs}),
                       os.path.join(folder, CALL_FILE))
        except (TypeError, AttributeError, RuntimeError, pickle.PicklingError) as error:  # an unpicklable argument
            shutil.rmtree(folder, ignore_errors=True)
            self.unsaved[call.name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            return out
        meta = {
            "format": FORMAT_VERSION, "op": call.name, "index": call.index, "phase": call.phase, "module": call.module,
            "device": str(device_of((call.args, call.kwargs))), "inputs": describe_tensors(
                (call.args, call.kwargs)), "outputs": describe_tensors(out), "torch": torch.__version__
        }
        with open(os.path.join(folder, META_FILE), "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1)
        self.saved.append(folder)
        return out

    def on_stop(self) -> None:
        if self.report is not None:
            print(f"capture: {len(self.saved)} op calls saved in {self.out_dir}", file=self.report)
            for op, reason in self.unsaved.items():
                print(f"  not saved: {op} ({reason})", file=self.report)
