"""Which module an op call belongs to, for forward and backward ops.

While at least one tool holds the tracker, global forward pre-hooks and forward hooks keep a
stack of module paths ("Transformer.layers.0.attn.q_proj"). When a module returns, the autograd
nodes its forward created are labelled with its path, so a backward op can be attributed through
the autograd node being executed. With no holder, no hook is installed.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch.nn.modules import module as nn_module
from torch.utils._pytree import tree_leaves

_LABEL = "ditorch_module"


class _ModuleTracker:

    def __init__(self):
        self._holders = 0
        self._handles = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._paths: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()

    @property
    def active(self) -> bool:
        return self._holders > 0

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._handles = [
                    nn_module.register_module_forward_pre_hook(self._enter),
                    nn_module.register_module_forward_hook(self._leave, always_call=True)
                ]
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                for handle in self._handles:
                    handle.remove()
                self._handles = []
                self._local.__dict__.clear()

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _path_of(self, module: torch.nn.Module, parent: str | None) -> str:
        path = self._paths.get(module)
        if path is None:
            if parent is None:  # a root: name its whole tree once
                root = type(module).__name__
                for name, sub in module.named_modules():
                    self._paths.setdefault(sub, f"{root}.{name}" if name else root)
                path = self._paths[module]
            else:
                path = f"{parent}.{type(module).__name__}"
        return path

    def _enter(self, module, args):
        stack = self._stack()
        path = self._path_of(module, stack[-1][0] if stack else None)
        inputs = {
            id(t.grad_fn): t.grad_fn for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.grad_fn is not None
        }
        stack.append((path, inputs))

    def _leave(self, module, args, output):
        stack = self._stack()
        if not stack:
            return
        path, inputs = stack.pop()
        if torch.is_grad_enabled():
            _label_backward_nodes(output, path, inputs)

    def current_path(self) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get(_LABEL, "")
        stack = self._stack()
        return stack[-1][0] if stack else ""


def _label_backward_nodes(output, path: str, stop: dict) -> None:
    """Label the autograd nodes created inside a module's forward (not yet labelled by a submodule)."""
    pending = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while pending:
        node = pending.pop()
        if node is None or id(node) in stop:
            continue
        metadata = node.metadata
        if _LABEL in metadata:
            continue
        metadata[_LABEL] = path
        pending.extend(next_node for next_node, _ in node.next_functions)


TRACKER = _ModuleTracker()
