"""The common shape of an op tool: a TorchDispatchMode that hands each selected ATen call to
`handle`, usable as a context manager or with start()/stop()."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_leaves

from ditorch.op_tools.module_tracker import TRACKER
from ditorch.op_tools.op_filter import OpFilter, qualified_name


@dataclasses.dataclass
class OpCall:
    """One ATen op call as a tool sees it."""

    func: Any  # torch._ops.OpOverload
    args: tuple
    kwargs: dict
    name: str  # 'aten.mm.default'
    module: str  # innermost module path, '' outside modules
    phase: str  # 'forward' or 'backward'
    index: int  # calls seen by this tool, counted from 0

    def run(self):
        return self.func(*self.args, **self.kwargs)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [t for t in tree_leaves((self.args, self.kwargs)) if isinstance(t, torch.Tensor)]

    @property
    def where(self) -> str:
        return f"{self.name} ({self.phase}{', in ' + self.module if self.module else ''})"


# Ops that are bookkeeping, not computation (the profiler's record_function markers).
UNTOUCHED_NAMESPACES = frozenset({"profiler"})


def returns_alias(func) -> bool:
    """True for views and other ops whose outputs share memory with an input without writing it."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def argument(func, args: tuple, kwargs: dict, name: str, default=None):
    """The value of the argument called `name` in a call of func, positional or keyword."""
    if name in kwargs:
        return kwargs[name]
    for position, spec in enumerate(func._schema.arguments):
        if spec.name == name:
            return args[position] if position < len(args) and not spec.kwarg_only else default
    return default


def is_random(func, args: tuple = (), kwargs: dict | None = None) -> bool:
    """True for ops that draw random numbers (an attention with dropout_p == 0 draws none)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    return argument(func, args, kwargs or {}, "dropout_p", default=None) not in (0, 0.0)


class OpTool(TorchDispatchMode):
    """Base class. Subclasses implement `handle(call)` and may override `on_start`/`on_stop`."""

    tool_name = "op tool"

    def __init__(self, ops: str | Iterable[str] | None = None, *, patterns: str | Iterable[str] | None = None,
                 predicate: Callable[[OpCall], bool] | None = None, exclude: str | Iterable[str] | None = None,
                 op_filter: OpFilter | None = None):
        super().__init__()
        self.op_filter = op_filter or OpFilter(ops, patterns, predicate, exclude)
        self.active = False
        self._counter = itertools.count()

    # Activation ------------------------------------------------------------------------------
    def start(self) -> "OpTool":
        self.__enter__()
        return self

    def stop(self) -> None:
        self.__exit__(None, None, None)

    def __enter__(self):
        if self.active:
            raise RuntimeError(f"{self.tool_name} is already active")
        TRACKER.acquire()
        self.active = True
        try:
            self.on_start()
            return super().__enter__()
        except BaseException:
            self.active = False
            TRACKER.release()
            raise

    def __exit__(self, exc_type, exc, traceback):
        if not self.active:
            raise RuntimeError(f"{self.tool_name} is not active")
        if _get_current_dispatch_mode() is not self:
            raise RuntimeError(f"{self.tool_name}: stop op tools in the reverse order of starting them")
        try:
            return super().__exit__(exc_type, exc, traceback)
        finally:
            self.active = False
            TRACKER.release()
            self.on_stop()

    def on_start(self) -> None:
        """Called when the tool becomes active (open files)."""

    def on_stop(self) -> None:
        """Called when the tool stops (flush files, print a summary)."""

    # Dispatch --------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in UNTOUCHED_NAMESPACES or not self.op_filter.matches_op(func):
            return func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        call = OpCall(func, args, kwargs, qualified_name(func), TRACKER.current_path(),
                      "backward" if node is not None else "forward", -1)
        if self.op_filter.predicate is not None and not self.op_filter.predicate(call):
            return func(*args, **kwargs)
        call.index = next(self._counter)
        return self.handle(call)

    def handle(self, call: OpCall):
        raise NotImplementedError
