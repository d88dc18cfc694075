"""The emulation layer on the OpenCL vendor (issue 33, Deliver 3): a cluster file's chip type with `vendor: opencl`
and an `emulation:` section opens its OpenCL device with the chip's memory capacity (allocations past it are
torch.OutOfMemoryError, as on the host vendor) and its relative speed (each kernel's run time on the device,
its OpenCL profiling START..END, divided by the speed, on a clock the host waits for). Each check runs in a
fresh process: the vendor reads its settings once, when the device opens. The timing checks assert on the
clock's accounting and on lower bounds the clock guarantees, never on how fast the host happened to be."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from conftest import run_python
from h2.core.cluster import load_cluster
from h2.core.emulation import describe_chip
from h2.core.errors import UserError
from test_opencl_vendor import warm_opencl_caches  # noqa: F401  (compiles the kernels outside the timed tests)

MEMORY_BYTES = 4_000_000


def cluster_file(directory, **chip_fields) -> str:
    entry = {
        "name": "emu-cl", "count": 1, "memory_gb": MEMORY_BYTES / 1e9, "chips_per_node": 1, "tp_max": 1,
        "intra_node_gbps": 2, "inter_node_gbps": 1, "emulated": True
    }
    entry.update(chip_fields)
    path = os.path.join(directory, "cluster.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump({"name": "emu-opencl", "chips": [entry]}, handle, sort_keys=False)
    return path


def on_emulated_chip(cluster: str, directory, body: str) -> dict:
    """Runs `body` in a fresh process whose dipu device is the cluster's only chip, opened as a rank opens
    it (heteropp.emulated_chip); body prints one JSON line, returned."""
    prelude = f"""
        import json, time, torch
        from h2.core.cluster import load_cluster
        from heteropp.emulated_chip import load_chip_vendor, open_emulated_chip
        (chip,) = load_cluster({cluster!r}).chips
        load_chip_vendor(chip.dipu_vendor)
        open_emulated_chip(chip, {str(directory / 'chips')!r})
        import ditorch.dipu as dipu
    """
    environment = {name: "" for name in ("DIPU_OPENCL_MEMORY_CAPACITY", "DIPU_OPENCL_RELATIVE_SPEED")}
    result = run_python(prelude + body, **environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


OUT_OF_MEMORY = """
        properties = torch.dipu.get_device_properties(0)
        kept = torch.empty(1 << 20, dtype=torch.uint8, device="dipu")
        try:
            torch.empty(4 << 20, dtype=torch.uint8, device="dipu")
            refusal = None
        except torch.OutOfMemoryError as error:
            refusal = str(error).splitlines()[0]
        after = (torch.ones(1000, device="dipu") * 2).sum().item()  # the device stays usable
        print(json.dumps({"vendor": dipu.vendor_name(), "memory": properties.total_memory,
                          "total": torch.dipu.mem_get_info(0)[1], "refusal": refusal, "after": after}))
"""


@pytest.mark.parametrize("vendor", ["opencl", "host"])
def test_an_emulated_chip_refuses_an_allocation_past_its_memory_on_either_vendor(tmp_path, vendor):
    cluster = cluster_file(tmp_path, vendor=vendor, emulation={"relative_speed": 0.5})
    report = on_emulated_chip(cluster, tmp_path, OUT_OF_MEMORY)
    assert report["vendor"] == vendor
    assert report["memory"] == report["total"] == MEMORY_BYTES
    assert report["refusal"] is not None and report["refusal"].startswith(
        "dipu out of memory on device 0: tried to allocate 4.00 MiB (4194304 bytes); 1.00 MiB allocated by tensors")
    assert f"device capacity 3.81 MiB ({MEMORY_BYTES} bytes)" in report["refusal"]
    assert report["after"] == 2000.0
    if vendor == "opencl":
        assert "(the emulated chip's memory)" in report["refusal"]


CLOCK = """
        properties = torch.dipu.get_device_properties(0)
        x = torch.randn(128, 128).to("dipu")
        (x @ x).tanh().cpu()  # warm: CLBlast's kernels for this size
        torch.dipu.synchronize()
        before = torch.dipu.pacing_stats()
        start, end = torch.dipu.Event(enable_timing=True), torch.dipu.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        for _ in range(8):
            x = (x @ x).tanh() / 128
        end.record()
        torch.dipu.synchronize()
        waited = time.perf_counter() - began
        after = torch.dipu.pacing_stats()
        print(json.dumps({"speed": properties.relative_speed, "before": before, "after": after, "waited_s": waited,
                          "events_s": start.elapsed_time(end) / 1e3}))
"""


def test_an_emulated_slow_opencl_chip_puts_each_kernel_on_its_clock_at_its_relative_speed(tmp_path):
    cluster = cluster_file(tmp_path, vendor="opencl", emulation={"relative_speed": 0.25})
    report = on_emulated_chip(cluster, tmp_path, CLOCK)
    before, after = report["before"], report["after"]
    assert report["speed"] == 0.25
    kernels = after["kernels"] - before["kernels"]
    emulated_s = after["emulated_s"] - before["emulated_s"]
    device_s = after["device_s"] - before["device_s"]
    assert kernels >= 8 * 3 and device_s > 0  # a GEMM, tanh and a division per iteration, at least
    # the clock: each kernel's time on the device, divided by the chip's relative speed
    assert emulated_s == pytest.approx(device_s / 0.25, rel=1e-6)
    # the host waited for the chip: the synchronised loop took at least its kernels' emulated time, and the
    # events around it measure the chip's time, not the device's
    assert report["waited_s"] >= emulated_s * 0.999
    assert report["events_s"] >= emulated_s * 0.999
    assert 0 <= after["late_kernels"] <= after["kernels"] and after["overrun_s"] >= 0


def test_an_opencl_chip_without_emulation_keeps_no_clock(tmp_path):
    cluster = cluster_file(tmp_path, vendor="opencl", emulated=False, memory_gb=1.0)
    report = on_emulated_chip(cluster, tmp_path, CLOCK)
    assert report["speed"] == 1.0
    assert report["after"]["kernels"] == 0 and report["after"]["emulated_s"] == 0.0


@pytest.mark.parametrize("setting, value, says", [
    ("DIPU_OPENCL_RELATIVE_SPEED", "2", "must be a number in (0, 1]"),
    ("DIPU_OPENCL_RELATIVE_SPEED", "fast", "must be a number in (0, 1]"),
    ("DIPU_OPENCL_MEMORY_CAPACITY", "12GiB", "must be a positive number of bytes"),
])
def test_a_bad_emulation_setting_is_one_line_naming_it(setting, value, says):
    result = run_python("import torch, ditorch.dipu; torch.dipu.device_count()", DIPU_VENDOR="opencl",
                        **{setting: value})
    assert result.returncode != 0
    assert f"{setting}={value}: {says}" in result.stderr


def test_an_opencl_chip_emulates_speed_and_memory_only_and_says_so(tmp_path):
    (chip, ) = load_cluster(cluster_file(tmp_path, vendor="opencl", emulation={"relative_speed": 0.25})).chips
    assert describe_chip(chip) == "emu-cl (emulated on opencl: 0.25x its OpenCL device, 4 MB)"
    precision = cluster_file(tmp_path, vendor="opencl", emulation={"relative_speed": 0.25, "precision": "bf16"})
    with pytest.raises(
            UserError, match=r"chip 'emu-cl': field 'emulation.precision' is 'bf16' but the chip's "
            r"vendor is 'opencl'"):
        load_cluster(precision)
    shared = cluster_file(tmp_path, vendor="opencl", emulation={"relative_speed": 0.25, "host_accessible": True})
    with pytest.raises(UserError, match=r"field 'emulation.host_accessible' is true but the chip's vendor is "
                       r"'opencl'"):
        load_cluster(shared)
