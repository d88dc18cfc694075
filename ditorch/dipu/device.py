"""The torch.dipu module: devices, streams, events, random state and memory of the dipu device,
shaped like torch.cuda so that code written for one reads the same on the other."""
import contextlib
import ctypes
import uuid
from dataclasses import dataclass

import torch

from ditorch.dipu import _C

_BACKEND = "dipu"
_PRIVATEUSE1_DEVICE_TYPE = 20  # c10::DeviceType::PrivateUse1


def _index(device=None) -> int:
    """Device index from None (current), an int, a string like "dipu:1" or a torch.device."""
    if device is None:
        return _C._current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != _BACKEND:
        raise ValueError(f"expected a dipu device, got {device}")
    return _C._current_device() if device.index is None else device.index


# ---- devices ----


def is_available() -> bool:
    try:
        return _C._device_count() > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    return _C._vendor_loaded()


def _is_in_bad_fork() -> bool:
    """True in a child process forked after the device was first used (it may not use the device)."""
    return _C._in_bad_fork()


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device) -> None:
    _C._set_device(_index(device))


def synchronize(device=None) -> None:
    _C._synchronize(_index(device))


class device:
    """Context manager making a dipu device current inside its block."""

    def __init__(self, device):
        self.index = _index(device)
        self.previous = None

    def __enter__(self):
        self.previous = _C._current_device()
        _C._set_device(self.index)

    def __exit__(self, *exc):
        _C._set_device(self.previous)
        return False


@dataclass(frozen=True)
class DeviceProperties:
    """A dipu device's properties under the names torch.cuda's carry (so that DataParallel, the profiler
    and libraries that read CUDA's properties read these), plus dipu's own (compute_units,
    host_accessible, relative_speed). The vendor ABI reports name, total_memory, compute_units
    (= multi_processor_count), host_accessible (= is_integrated: the device works in host memory),
    relative_speed, major and minor; CUDA's remaining attributes have no ABI field yet and read as
    UNREPORTED_BY_THE_VENDOR says (uuid is derived from the vendor, index and name)."""
    name: str
    total_memory: int
    compute_units: int
    host_accessible: bool
    relative_speed: float
    major: int
    minor: int
    multi_processor_count: int
    is_integrated: int
    is_multi_gpu_board: int
    uuid: str
    warp_size: int
    max_threads_per_block: int
    max_threads_per_multi_processor: int
    regs_per_multiprocessor: int
    shared_memory_per_block: int
    shared_memory_per_block_optin: int
    shared_memory_per_multiprocessor: int
    L2_cache_size: int
    clock_rate: int
    memory_clock_rate: int
    memory_bus_width: int
    pci_bus_id: int
    pci_device_id: int
    pci_domain_id: int
    gcnArchName: str


# CUDA's attributes the vendor ABI does not report: one thread per lane, no figure for the rest.
UNREPORTED_BY_THE_VENDOR = {
    "is_multi_gpu_board": 0,
    "warp_size": 1,
    "max_threads_per_block": 1,
    "max_threads_per_multi_processor": 1,
    "regs_per_multiprocessor": 0,
    "shared_memory_per_block": 0,
    "shared_memory_per_block_optin": 0,
    "shared_memory_per_multiprocessor": 0,
    "L2_cache_size": 0,
    "clock_rate": 0,
    "memory_clock_rate": 0,
    "memory_bus_width": 0,
    "pci_bus_id": 0,
    "pci_device_id": 0,
    "pci_domain_id": 0,
    "gcnArchName": "",
}


def _device_uuid(index: int, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"dipu://{_C._vendor_name()}/{index}/{name}"))


def get_device_properties(device=None) -> DeviceProperties:
    index = _index(device)
    reported = dict(_C._device_properties(index))
    reported.update(UNREPORTED_BY_THE_VENDOR)
    reported.update(multi_processor_count=reported["compute_units"], is_integrated=int(reported["host_accessible"]),
                    uuid=_device_uuid(index, reported["name"]))
    return DeviceProperties(**reported)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True


# ---- streams and events ----


class Stream:
    """Creates a dipu stream (a torch.Stream): work queued on it runs in order."""

    def __new__(cls, device=None, priority=0) -> torch.Stream:
        return torch.Stream(device=torch.device(_BACKEND, _index(device)), priority=priority)


class Event:
    """Creates a dipu event (a torch.Event): marks a point in a stream; elapsed_time() measures
    between two."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False) -> torch.Event:
        return torch.Event(device=_BACKEND, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


def default_stream(device=None) -> torch.Stream:
    return torch.Stream(stream_id=0, device_index=_index(device), device_type=_PRIVATEUSE1_DEVICE_TYPE)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(stream: torch.Stream):
    """Make `stream` current on its device inside the block."""
    if stream is None:
        yield
        return
    previous = current_stream(stream.device_index)
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(previous)


# ---- random numbers ----


def default_generator(device=None) -> torch.Generator:
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        default_generator(index).manual_seed(int(seed))


def seed() -> int:
    return default_generator().seed()


def seed_all() -> None:
    for index in range(device_count()):
        default_generator(index).seed()


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    default_generator(device).set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state(index) for index in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


# ---- memory ----


def memory_stats(device=None) -> dict:
    """Caching-allocator statistics: {allocated_bytes, reserved_bytes, ...: {current, peak, allocated, freed}}."""
    return _C._memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    """Bytes held by live tensors (each rounded up to the allocator's 512-byte blocks)."""
    return memory_stats(device)["allocated_bytes"]["current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes"]["peak"]


def memory_reserved(device=None) -> int:
    """Bytes obtained from the vendor: live tensors plus cached free blocks."""
    return memory_stats(device)["reserved_bytes"]["current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes"]["peak"]


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """Return cached free blocks to the vendor."""
    _C._empty_cache()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the device as the vendor reports them."""
    return tuple(_C._mem_get_info(_index(device)))


# ---- emulation ----


def pacing_stats() -> dict | None:
    """How well an emulating vendor kept its chip's kernel times since the device opened:
    {kernels, late_kernels, emulated_s, overrun_s} (late kernels finished after their emulated time
    because the host was busy), or None when the vendor does not emulate a speed. A vendor that paces
    kernels measured on its own device (the OpenCL vendor) adds `device_s`: their run time there, which
    the emulated time is at the chip's relative speed."""
    stats = _C._pacing_stats()
    if stats is not None:
        run_time = getattr(ctypes.CDLL(_C._vendor_path()), "dipuGetPacedRunTime", None)
        if run_time is not None:
            seconds = ctypes.c_double()
            run_time(ctypes.byref(seconds))
            stats["device_s"] = seconds.value
    return stats
