"""DiComm: point-to-point communication between chips of different vendors.

Owns: the Python API over the C++ transports (tcp, shm, ibverbs), the torch.distributed
"dicomm" backend registration, and the benchmark. Must not import h2, heteropp or ditorch.
"""
