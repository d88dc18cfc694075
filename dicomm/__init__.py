"""DiComm: point-to-point communication between chips of different vendors.

Owns: the Python API over the C++ transports (tcp, shm, ibverbs), the torch.distributed
"dicomm" backend registration, and the benchmark. Must not import h2, heteropp or ditorch.
The C++ core (csrc/dicomm) never needs torch: rendezvous takes any object with set/get.
"""
from dicomm.endpoint import CommError, Endpoint, FrameError, Handle, live_requests, probe_ibverbs
from dicomm.store import FileStore

__all__ = ["CommError", "Endpoint", "FileStore", "FrameError", "Handle", "live_requests", "probe_ibverbs"]
