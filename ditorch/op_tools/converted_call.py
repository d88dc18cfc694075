"""Running an op call on converted inputs (moved to another device, cast to another dtype) and
giving the caller results that look like the original call's: arguments the op writes are
updated in place, outputs converted back, and outputs that alias a written argument are that
original argument."""

from __future__ import annotations

from typing import Callable

import torch

from ditorch.op_tools.tensors import hidden, map_tensors
from ditorch.op_tools.tool import OpCall


def written_arguments(call: OpCall, args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(original, converted) pairs of the tensor arguments the op writes (in-place and out= ops)."""
    pairs = []
    for position, spec in enumerate(call.func._schema.arguments):
        if spec.alias_info is None or not spec.alias_info.is_write:
            continue
        if spec.name in call.kwargs:
            original, converted = call.kwargs[spec.name], kwargs[spec.name]
        elif position < len(call.args):
            original, converted = call.args[position], args[position]
        else:
            continue
        if isinstance(original, torch.Tensor):
            pairs.append((original, converted))
        elif isinstance(original, (list, tuple)):
            pairs.extend((o, c) for o, c in zip(original, converted) if isinstance(o, torch.Tensor))
    return pairs


def run_converted(call: OpCall, convert: Callable[[torch.Tensor], torch.Tensor],
                  convert_back: Callable[[torch.Tensor], torch.Tensor], rewrite: Callable = lambda value: value):
    """Run call.func on converted tensors (and `rewrite` applied to the arguments, e.g. devices)."""
    with hidden():
        args, kwargs = rewrite(map_tensors(lambda t: convert(t.detach()), (call.args, call.kwargs)))
    out = call.func(*args, **kwargs)
    written = written_arguments(call, args, kwargs)
    with hidden():
        for original, converted in written:
            if converted is not original:
                original.copy_(converted)
        originals = {id(converted): original for original, converted in written}
        return map_tensors(lambda t: originals[id(t)] if id(t) in originals else convert_back(t), out)
