"""dipu tensors and other processes: refused in one line rather than failing deep in pickling.

Pickling has no way to hand device memory to another process (the vendor's memory handles,
ditorch.dipu.memory_ipc, serve DiComm's transfers only), so a dipu tensor sent to a worker
(torch.multiprocessing, hogwild-style training after `share_memory()`) is refused when it is
pickled, naming what to do instead. (`share_memory_()` on a dipu tensor is a no-op, as for CUDA.)
"""

from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as reductions

from ditorch.dipu.errors import DipuError

_BACKEND = "dipu"


def _reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type == _BACKEND:
        raise DipuError(f"a {_BACKEND} tensor cannot be sent to another process: this device shares no memory "
                        "between processes; send tensor.cpu() (with share_memory_() for hogwild-style training) "
                        "or use torch.distributed")
    return reductions.reduce_tensor(tensor)


def refuse_device_tensors_in_pickles() -> None:
    for tensor_class in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(tensor_class, _reduce_tensor)
