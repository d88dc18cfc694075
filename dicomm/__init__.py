"""DiComm: point-to-point communication between chips of different vendors.

Owns: the Python API over the C++ transports (tcp, shm, ibverbs: `endpoint`), the torch.distributed
"dicomm" backend (`torch_backend`), the store adapter and the chip -> NIC map (`topology`, `python -m
dicomm topology`). Its benchmarks are scripts in benchmarks/dicomm/. Must not import heteropp, ditorch
or h2 above its bottom layer h2.core. The C++ core (csrc/dicomm) never needs torch:
rendezvous takes any object with set/get. Design and configuration: docs/dicomm.md.
"""
from dicomm.endpoint import CommError, Endpoint, FrameError, Handle, live_requests, probe_ibverbs
from dicomm.store import FileStore

__all__ = ["CommError", "Endpoint", "FileStore", "FrameError", "Handle", "live_requests", "probe_ibverbs"]

try:
    import torch.distributed as _torch_distributed
except ImportError:  # the core works without torch; the backend needs it
    _torch_distributed = None
if _torch_distributed is not None and _torch_distributed.is_available():
    from dicomm import torch_backend  # noqa: F401  (registers the "dicomm" backend)
