"""At interpreter exit, let autograd's dipu worker threads finish with Python first.

A backward on a non-CPU device runs on autograd's worker thread for that device. The worker signals
the backward's end and only then drops its reference to the finished graph task, whose saved thread
state holds a Python object (torch stashes the caller's context there); dropping it takes the GIL. When
the program ends right after the backward, that can happen while the interpreter finalizes, and a
thread that asks for the GIL then is ended by Python mid-C++ (`terminate called without an active
exception`, exit status 134).

Before finalization, one tiny backward per device goes straight to the autograd engine (so its graph
task holds no Python object): each worker must have dropped its previous graph task, with the GIL
available, before it can take the new one.
"""

import atexit

import torch

from ditorch.dipu import _C


def settle_autograd_workers() -> None:
    if not _C._vendor_loaded():
        return  # the device was never used: no backward ran on it
    engine = torch.autograd.Variable._execution_engine
    try:
        for index in range(_C._device_count()):
            leaf = torch.zeros((), device=f"dipu:{index}", requires_grad=True)
            output = leaf * 1
            engine.run_backward((output, ), (torch.ones_like(output), ), False, False, (), True, True)
    except RuntimeError:
        pass  # a device in a failed state at exit: nothing more to do for it


def register() -> None:
    atexit.register(settle_autograd_workers)
