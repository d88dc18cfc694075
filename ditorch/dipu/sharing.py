"""dipu tensors and other processes: refused in one line naming the vendor, rather than failing deep in pickling.

Pickling has no way to hand device memory to another process: the OpenCL vendor exports no memory handles at
all (OpenCL 1.2 cannot hand a cl_mem to another process), and the host vendor's (ditorch.dipu.memory_ipc)
serve DiComm's transfers only. So every entry point through which torch would share a dipu tensor's memory
with another process refuses it in one line that names the vendor and what to do instead: pickling a dipu
tensor or storage for a worker (torch.multiprocessing, hogwild-style training after `share_memory()`), and
a dipu storage's `_share_cuda_` (CUDA's IPC handle, which torch would otherwise refuse with "CUDA is not
available") and `_share_fd_cpu_` / `_share_filename_cpu_` (which torch refuses as "only available on CPU").
(`share_memory_()` on a dipu tensor is a no-op, as for CUDA.)
"""

import functools
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as reductions

from ditorch.dipu import _C
from ditorch.dipu.errors import DipuError

_BACKEND = "dipu"
# Why each vendor's memory cannot go to another process through torch (a vendor not named: it exports none).
_WHY = {
    "opencl": "it exports no memory handles (dipuIpcGetMemHandle): OpenCL 1.2 cannot hand a cl_mem to another "
    "process",
    "host": "its memory handles serve DiComm's transfers only, not torch's pickling",
}
_STORAGE_SHARING = ("_share_cuda_", "_share_fd_cpu_", "_share_filename_cpu_")


def sharing_refusal(what: str) -> DipuError:
    """The one line refusing to send `what` (a dipu tensor or storage) to another process, naming the vendor."""
    vendor = _C._vendor_name()
    why = _WHY.get(vendor, "it exports no memory handles (dipuIpcGetMemHandle)")
    return DipuError(f"a {_BACKEND} {what} cannot be sent to another process: the {vendor} vendor shares no device "
                     f"memory between processes ({why}); send tensor.cpu() (with share_memory_() for hogwild-style "
                     "training) or use torch.distributed")


def _on_device(storage) -> bool:
    untyped = getattr(storage, "_untyped_storage", storage)  # a TypedStorage's (its .device warns)
    return untyped.device.type == _BACKEND


def _reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type == _BACKEND:
        raise sharing_refusal("tensor")
    return reductions.reduce_tensor(tensor)


def _refusing_storage(reduce):

    def reduce_storage(storage):
        if _on_device(storage):
            raise sharing_refusal("storage")
        return reduce(storage)

    return reduce_storage


def _refusing_share(method):

    @functools.wraps(method)
    def share(self, *args, **kwargs):
        if _on_device(self):
            raise sharing_refusal("storage")
        return method(self, *args, **kwargs)

    share.refuses_dipu = True
    return share


def refuse_device_tensors_in_pickles() -> None:
    for tensor_class in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(tensor_class, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _refusing_storage(reductions.reduce_storage))
    ForkingPickler.register(torch.storage.TypedStorage, _refusing_storage(reductions.reduce_typed_storage))
    for name in _STORAGE_SHARING:
        method = getattr(torch.UntypedStorage, name, None)
        if method is not None and not getattr(method, "refuses_dipu", False):
            setattr(torch.UntypedStorage, name, _refusing_share(method))
