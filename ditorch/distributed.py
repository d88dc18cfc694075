"""torch.distributed for CUDA-written scripts on another vendor: backend "nccl" becomes the
vendor's collective library, and a host-staged gloo backend serves devices gloo cannot read.

"hostgloo" runs each collective by copying the device tensors to host memory, running gloo there
and copying the results back. It is synchronous and correct rather than fast; DiComm's "dicomm"
backend replaces it where it is registered.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed import device_mesh

from ditorch.patches import Patches
from h2.core import devices

HOST_STAGED_GLOO = "hostgloo"
_ABSENT = object()


def _completed_work(result):
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class HostStagedGloo(dist.ProcessGroup):
    """A process group whose collectives run on gloo over host copies of the device tensors."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore(HOST_STAGED_GLOO, store), rank, size, timeout)

    def getBackendName(self) -> str:
        return HOST_STAGED_GLOO

    @staticmethod
    def _to_host(tensors):
        return [t.detach().to("cpu").contiguous() for t in tensors]

    @staticmethod
    def _write_back(devices, hosts):
        for device_tensor, host_tensor in zip(devices, hosts):
            device_tensor.copy_(host_tensor)

    def _staged(self, tensors, run):
        host = self._to_host(tensors)
        run(host).wait()
        self._write_back(tensors, host)
        return _completed_work(tensors)

    def allreduce(self, tensors, opts):
        return self._staged(tensors, lambda host: self._gloo.allreduce(host, opts))

    def allreduce_coalesced(self, tensors, opts):
        return self._staged(tensors, lambda host: self._gloo.allreduce_coalesced(host, opts))

    def broadcast(self, tensors, opts):
        return self._staged(tensors, lambda host: self._gloo.broadcast(host, opts))

    def allgather(self, output_lists, inputs, opts):
        host_outputs = [self._to_host(outputs) for outputs in output_lists]
        self._gloo.allgather(host_outputs, self._to_host(inputs), opts).wait()
        for outputs, host in zip(output_lists, host_outputs):
            self._write_back(outputs, host)
        return _completed_work(output_lists)

    def reduce_scatter(self, outputs, input_lists, opts):
        host_outputs = self._to_host(outputs)
        self._gloo.reduce_scatter(host_outputs, [self._to_host(inputs) for inputs in input_lists], opts).wait()
        self._write_back(outputs, host_outputs)
        return _completed_work(outputs)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        host_output = self._to_host([output])[0]
        self._gloo.alltoall_base(host_output, self._to_host([input])[0], output_splits, input_splits, opts).wait()
        output.copy_(host_output)
        return _completed_work([output])

    def barrier(self, opts):
        self._gloo.barrier(opts).wait()
        return _completed_work([])

    def send(self, tensors, dst, tag):
        self._gloo.send(self._to_host(tensors), dst, tag).wait()
        return _completed_work(tensors)

    def recv(self, tensors, src, tag):
        return self._staged(tensors, lambda host: self._gloo.recv(host, src, tag))


def register_host_staged_gloo(device_type: str) -> None:
    """Make hostgloo the fallback backend of `device_type`, used when no faster one serves it."""
    if HOST_STAGED_GLOO not in dist.Backend.backend_list:
        dist.Backend.register_backend(HOST_STAGED_GLOO, HostStagedGloo, devices=[device_type])
    devices.serve_device(device_type, HOST_STAGED_GLOO, fallback=True)


def device_collective_backend(adapter) -> str:
    """The backend that serves the vendor's device tensors: for dipu, whatever h2.core.devices says
    serves it (DiComm where it is installed), else hostgloo; for other vendors, their own library."""
    if adapter.name == "dipu":
        return devices.collective_backend(adapter.device_type) or HOST_STAGED_GLOO
    return adapter.collective_backend


def collective_backend_for(adapter) -> str:
    """The backend string that replaces "nccl": DITORCH_COLLECTIVE_BACKEND, else the vendor's own."""
    override = os.environ.get("DITORCH_COLLECTIVE_BACKEND")
    if override:
        return override
    return f"cpu:gloo,{adapter.device_type}:{device_collective_backend(adapter)}"


class DistributedMapping:
    """Wraps init_process_group and new_group so backend "nccl" (and "cuda:nccl") means the vendor's."""

    def __init__(self, adapter, device_translator):
        self.adapter = adapter
        self.translate = device_translator
        self._patches = Patches()
        self.backend: str | None = None
        self._replaced_default_backend: tuple[str, object] | None = None

    def map_backend(self, backend):
        """"nccl" -> the vendor's backend string; "cpu:gloo,cuda:nccl" -> the vendor's entry for cuda:nccl."""
        if not isinstance(backend, str) or "nccl" not in backend.lower():
            return backend
        if ":" not in backend:
            return self.backend
        entries = []
        for entry in backend.lower().split(","):
            device, _, name = entry.partition(":")
            if name == "nccl":
                entry = f"{self.adapter.device_type}:{device_collective_backend(self.adapter)}"
            entries.append(entry)
        return ",".join(entries)

    def apply(self) -> None:
        if self.adapter.name == "dipu":
            register_host_staged_gloo(self.adapter.device_type)
        self.backend = collective_backend_for(self.adapter)
        self._answer_default_backend_for_device()
        mapping = self

        def wrap(name, translate_device_id):
            original = getattr(dist, name)

            @functools.wraps(original)
            def wrapper(*args, **kwargs):
                given = args[0] if args else kwargs.get("backend")
                # no backend: torch picks NCCL for CUDA, so the vendor's backend here
                backend = mapping.backend if given is None else mapping.map_backend(given)
                if args:
                    args = (backend, *args[1:])
                else:
                    kwargs["backend"] = backend
                if translate_device_id and kwargs.get("device_id") is not None:
                    kwargs["device_id"] = torch.device(mapping.translate(kwargs["device_id"]))
                return original(*args, **kwargs)

            self._patches.replace(dist, name, wrapper)

        wrap("init_process_group", True)
        for module in (dist.distributed_c10d, device_mesh):  # init_device_mesh initialises the world itself
            if hasattr(module, "init_process_group"):
                self._patches.replace(module, "init_process_group", dist.init_process_group)

        original_get_backend = dist.get_backend

        @functools.wraps(original_get_backend)
        def get_backend(group=None):
            """A group made for "nccl" answers "nccl", as on CUDA (scripts compare it)."""
            backend = original_get_backend(group)
            return "nccl" if backend == mapping.backend else backend

        self._patches.replace(dist, "get_backend", get_backend)

        original_new_group = dist.new_group

        @functools.wraps(original_new_group)
        def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
            return original_new_group(ranks, timeout, mapping.map_backend(backend), *args, **kwargs)

        self._patches.replace(dist, "new_group", new_group)
        if self.adapter.name == "dipu":
            self._dtensor_random_as_on_a_cpu_mesh()

    def _answer_default_backend_for_device(self) -> None:
        """get_default_backend_for_device(device) names the backend that serves the vendor's device
        (torch keeps the first backend registered for a device type, which may be a fallback)."""
        backend_map = dist.Backend.default_device_backend_map
        device_type = self.adapter.device_type
        self._replaced_default_backend = (device_type, backend_map.get(device_type, _ABSENT))
        backend_map[device_type] = device_collective_backend(self.adapter)

    def _dtensor_random_as_on_a_cpu_mesh(self) -> None:
        """DTensor's offset-based random tracker needs a Philox generator (seed + offset) and dipu's is
        the CPU's mt19937 (so that dipu draws what the CPU draws): on a dipu mesh, random DTensor ops run
        as on a CPU mesh (each rank draws its local part; DTensor warns) instead of asserting."""
        from torch.distributed.tensor import _dispatch, _random

        original = _random.is_rng_supported_mesh
        device_type = self.adapter.device_type

        @functools.wraps(original)
        def is_rng_supported_mesh(device_mesh):
            return device_mesh.device_type not in (device_type, "cuda") and original(device_mesh)

        for module in (_random, _dispatch):
            self._patches.replace(module, "is_rng_supported_mesh", is_rng_supported_mesh)

    def undo(self) -> None:
        self._patches.undo()
        if self._replaced_default_backend is not None:
            device_type, original = self._replaced_default_backend
            backend_map = dist.Backend.default_device_backend_map
            if original is _ABSENT:
                backend_map.pop(device_type, None)
            else:
                backend_map[device_type] = original
            self._replaced_default_backend = None
