"""Single-process checks of the device-generic PyTorch surface, run in a fresh interpreter per vendor
(DIPU_VENDOR is read once per process): `python device_generic_checks.py <check>` prints one JSON line."""
from __future__ import annotations

import json
import sys

import torch

import ditorch  # noqa: F401  (import order as a user's script has it: torch, then ditorch)

CUDA_PROPERTY_NAMES = ("name", "major", "minor", "multi_processor_count", "total_memory", "is_integrated",
                       "is_multi_gpu_board", "max_threads_per_multi_processor", "gcnArchName", "warp_size", "uuid",
                       "L2_cache_size", "clock_rate", "memory_clock_rate", "memory_bus_width",
                       "shared_memory_per_block", "shared_memory_per_multiprocessor", "regs_per_multiprocessor",
                       "max_threads_per_block", "shared_memory_per_block_optin", "pci_bus_id", "pci_device_id",
                       "pci_domain_id")


def accelerator() -> dict:
    import torch.distributed as dist

    found = {"accelerator": str(torch.accelerator.current_accelerator()), "count": torch.accelerator.device_count()}
    with torch.accelerator.device_index(1):
        found["inside_device_index_1"] = torch.accelerator.current_device_index()
        found["tensor_inside"] = str(torch.ones(1, device=torch.accelerator.current_accelerator()).device)
    found["after_device_index"] = torch.accelerator.current_device_index()
    torch.accelerator.set_device_index(1)
    found["after_set_device_index_1"] = (torch.accelerator.current_device_index(), torch.dipu.current_device())
    x = torch.ones(64, device="dipu") * 3
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    found["synchronized_value"] = x.sum().item()
    torch.accelerator.set_device_index(0)
    found["default_backend"] = dist.get_default_backend_for_device("dipu")
    found["default_backend_of_device"] = dist.get_default_backend_for_device(torch.device("dipu", 1))
    return found


def properties() -> dict:
    found = {}
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        own = torch.dipu.get_device_properties(index)
        found[index] = {name: getattr(props, name, "MISSING") for name in CUDA_PROPERTY_NAMES}
        found[index]["vendor"] = {
            "compute_units": own.compute_units, "host_accessible": own.host_accessible, "name": own.name,
            "total_memory": own.total_memory
        }
    return found


def data_parallel() -> dict:
    """nn.DataParallel over the two devices: where the replicas ran, and output and gradients against the CPU."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model.load_state_dict(reference.state_dict())
    replica_devices = []
    model[0].register_forward_hook(lambda module, args, output: replica_devices.append(str(output.device)))
    wrapped = torch.nn.DataParallel(model.cuda())
    # what DataParallel does on CUDA: compares the devices' properties (multi_processor_count, total_memory)
    sys.modules["torch.nn.parallel.data_parallel"]._check_balance(wrapped.device_ids)
    inputs = torch.randn(8, 6)
    output = wrapped(inputs.cuda())
    output.square().mean().backward()
    expected = reference(inputs)
    expected.square().mean().backward()
    gradient_error = max((p.grad.cpu() - r.grad).abs().max().item()
                         for p, r in zip(model.parameters(), reference.parameters()))
    return {
        "device_ids": wrapped.device_ids, "source_device": str(wrapped.src_device_obj), "replica_devices": sorted(
            set(replica_devices)), "output_device": str(output.device),
        "output_error": (output.detach().cpu() - expected.detach()).abs().max().item(), "gradient_error": gradient_error
    }


def visible() -> dict:
    return {
        "cuda": torch.cuda.device_count(), "accelerator": torch.accelerator.device_count(),
        "dipu": torch.dipu.device_count(), "value": torch.ones(2, device="cuda").sum().item()
    }


if __name__ == "__main__":
    print("result " + json.dumps(globals()[sys.argv[1]]()))
