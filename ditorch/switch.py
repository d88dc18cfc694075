"""The one-line switch: pick the node's vendor and, unless it is CUDA, map the CUDA surface onto it.

State lives here: which vendor is active, what each adapter's probe said, and which mappings are
installed, so that `ditorch info` can report them and `ditorch.use(name)` can switch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ditorch.compile import CompileMapping
from ditorch.cuda_surface import CudaSurface
from ditorch.device_args import DeviceArguments
from ditorch.distributed import DistributedMapping
from ditorch.vendors import ADAPTERS, DETECTION_ORDER, Probe, VendorAdapter, detect, get_adapter
from h2.core import environment


@dataclass
class SwitchState:
    vendor: VendorAdapter | None = None
    probes: dict[str, Probe] = field(default_factory=dict)
    disabled_reason: str | None = None
    surface: CudaSurface | None = None
    device_args: DeviceArguments | None = None
    distributed: DistributedMapping | None = None
    compile: CompileMapping | None = None

    @property
    def mapped(self) -> bool:
        return self.surface is not None


STATE = SwitchState()


def _unmap() -> None:
    for part in (STATE.compile, STATE.distributed, STATE.device_args, STATE.surface):
        if part is not None:
            part.undo()
    STATE.surface = STATE.device_args = STATE.distributed = STATE.compile = None


def _map_onto(adapter: VendorAdapter) -> None:
    if adapter.name == "dipu":
        from ditorch.dipu import _C, visible
        if not _C._vendor_loaded():
            visible.apply(cuda_mapped=True)  # CUDA_VISIBLE_DEVICES now speaks of dipu's devices
    STATE.surface = CudaSurface(adapter.name, adapter.device_type)
    STATE.surface.apply()
    STATE.device_args = DeviceArguments(adapter.device_type)
    STATE.device_args.apply()
    STATE.distributed = DistributedMapping(adapter, STATE.device_args.translate)
    STATE.distributed.apply()
    STATE.compile = CompileMapping(adapter.device_type)
    STATE.compile.apply()


def activate(vendor: str | None = None) -> VendorAdapter | None:
    """Select `vendor` (or detect one) and map the CUDA surface onto it unless it is CUDA itself."""
    if environment.switch("DITORCH_DISABLE"):
        STATE.disabled_reason = "DITORCH_DISABLE is set"
        return None
    name = vendor or os.environ.get("DITORCH_VENDOR") or None
    if name:
        adapter = get_adapter(name)
        probe = adapter.probe()
        STATE.probes = {
            **{n: Probe(False, "not probed: vendor chosen explicitly") for n in DETECTION_ORDER}, name: probe
        }
        if not probe.available:
            raise RuntimeError(f"ditorch vendor '{name}' is not usable here: {probe.reason}")
    else:
        adapter, STATE.probes = detect()
    if adapter is STATE.vendor and (STATE.mapped or adapter is None or adapter.name == "cuda"):
        return adapter  # idempotent
    _unmap()
    STATE.vendor = adapter
    if adapter is not None and adapter.name != "cuda":
        _map_onto(adapter)
    return adapter


def use(name: str) -> VendorAdapter:
    """Switch to vendor `name` (cuda, npu, mlu, musa, xpu, dipu); raises if it is not usable here."""
    return activate(name)


def deactivate() -> None:
    """Undo every mapping (for tests and for scripts that want plain torch back)."""
    _unmap()
    STATE.vendor = None


def info() -> dict:
    """What `ditorch info` prints: vendor, devices, versions, probes and active mappings."""
    adapter = STATE.vendor
    devices, devices_error = [], None
    try:
        count = adapter.device_module().device_count() if adapter is not None else 0
    except RuntimeError as error:  # a vendor that fails to open: reported, not raised
        count, devices_error = 0, str(error).splitlines()[0]
    if adapter is not None:
        module = adapter.device_module()
        for index in range(count):
            entry = {"index": index, "device": f"{adapter.device_type}:{index}"}
            if hasattr(module, "get_device_properties"):
                props = module.get_device_properties(index)
                entry["name"] = getattr(props, "name", str(props))
                total = getattr(props, "total_memory", None)
                if total is not None:
                    entry["total_memory"] = total
            devices.append(entry)
    return {
        "torch": torch.__version__,
        "vendor": adapter.name if adapter else None,
        "vendor_label": adapter.label if adapter else None,
        "device_type": adapter.device_type if adapter else None,
        "disabled": STATE.disabled_reason,
        "devices": devices,
        "devices_error": devices_error,
        "adapters": {
            name: {
                "label": ADAPTERS[name].label, "available": p.available, "reason": p.reason,
                "device_count": p.device_count
            } for name, p in STATE.probes.items()
        },
        "cuda_mapped": STATE.mapped,
        "mappings": {
            "torch.cuda": dict(STATE.surface.mapped) if STATE.surface else {},
            "device_arguments": list(STATE.device_args.mapped) if STATE.device_args else [],
            "distributed_backend_for_nccl": STATE.distributed.backend if STATE.distributed else None,
        },
    }
