"""The OpenCL vendor (csrc/dipu/vendor/opencl) behind the DIPU shim, each check in a process whose
DIPU_VENDOR is opencl: device properties and `ditorch info`, copies and views, CLBlast GEMMs against
torch.mm, memory statistics and out-of-memory, and bad platform/device settings or a missing ICD."""
import json
import os
import subprocess
import sys

import pytest

from conftest import run_python

OPENCL = {"DIPU_VENDOR": "opencl"}


def run_opencl(code: str, **env) -> subprocess.CompletedProcess:
    result = run_python(code, **OPENCL, **env)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="session", autouse=True)
def warm_opencl_caches():
    """Compiles the vendor's program (kept as a binary on disk) and CLBlast's GEMM kernels at the sizes
    the tests use (kept in pocl's kernel cache), once, so the tests measure none of the compiling."""
    run_opencl("""
        import torch, ditorch.dipu
        for m, k, n in ((5, 7, 3), (64, 48, 32), (130, 70, 90)):
            a, b = torch.randn(m, k, device="dipu"), torch.randn(k, n, device="dipu")
            (a @ b).cpu(); (a.t().contiguous().t() @ b.t().contiguous().t()).cpu()
            torch.addmm(torch.randn(n, device="dipu"), a, b).cpu()
            torch.bmm(a.expand(2, m, k).contiguous(), b.expand(2, k, n).contiguous()).cpu()
        (torch.ones(3, device="dipu") + 1).cpu()
    """)


def test_device_properties_come_from_the_icd_and_info_names_platform_device_and_driver():
    clinfo = subprocess.run(["clinfo", "-l"], capture_output=True, text=True, check=True).stdout
    properties = json.loads(
        run_opencl("""
        import json, torch, ditorch.dipu as dipu
        p = torch.dipu.get_device_properties(0)
        print(json.dumps({"vendor": dipu.vendor_name(), "count": torch.dipu.device_count(), "name": p.name,
                          "memory": p.total_memory, "units": p.compute_units, "host": p.host_accessible,
                          "free_total": list(torch.dipu.mem_get_info(0))}))
    """).stdout)
    assert properties["vendor"] == "opencl" and properties["count"] >= 1
    assert properties["name"] and properties["name"] in clinfo
    assert properties["memory"] > 0 and properties["units"] > 0 and properties["host"] is False
    assert properties["free_total"][1] == properties["memory"]
    info = subprocess.run([sys.executable, "-m", "h2.cli.ditorch", "info"], capture_output=True, text=True,
                          env={**os.environ, **OPENCL}, timeout=300)
    assert info.returncode == 0, info.stderr
    assert f"dipu:0 {properties['name']}: " in info.stdout and "not host-accessible" in info.stdout
    description = next(line for line in info.stdout.splitlines() if "OpenCL platform '" in line)
    assert f"device '{properties['name']}'" in description and ", driver " in description


def test_copies_views_casts_and_memory_statistics_round_trip():
    result = run_opencl("""
        import torch, ditorch.dipu
        torch.manual_seed(0)
        a = torch.randn(6, 8)
        d = a.to("dipu")
        checks = {
            "h2d_d2h": torch.equal(d.cpu(), a),
            "clone": torch.equal(d.clone().cpu(), a),
            "slice": torch.equal(d[1:5, 2:7].cpu(), a[1:5, 2:7]),
            "step": torch.equal(d[::2, 1::3].cpu(), a[::2, 1::3]),
            "transpose": torch.equal(d.t().contiguous().cpu(), a.t().contiguous()),
            "strided_into_strided": None,
            "cast_long": torch.equal(d.long().cpu(), a.long()),
            "cast_bool": torch.equal((d > 0).cpu(), a > 0),
            "int_round_trip": torch.equal(torch.arange(10).to("dipu").cpu(), torch.arange(10)),
            "zero_": torch.equal(d.clone().zero_().cpu(), torch.zeros_like(a)),
            "fill_long": torch.equal(torch.empty(5, dtype=torch.long, device="dipu").fill_(7).cpu(),
                                     torch.full((5,), 7)),
        }
        target = torch.zeros(8, 6, device="dipu")
        target[::2].copy_(d.t()[::2])
        expected = torch.zeros(8, 6)
        expected[::2].copy_(a.t()[::2])
        checks["strided_into_strided"] = torch.equal(target.cpu(), expected)
        pinned = torch.randn(1000).pin_memory()
        on_device = pinned.to("dipu", non_blocking=True)
        back = torch.empty(1000).pin_memory()
        back.copy_(on_device, non_blocking=True)
        torch.dipu.synchronize()
        checks["non_blocking"] = torch.equal(back, pinned)
        stream = torch.dipu.Stream()
        with torch.dipu.stream(stream):
            doubled = d * 2
        event = stream.record_event()
        torch.dipu.current_stream().wait_event(event)
        checks["stream"] = torch.equal(doubled.cpu(), a * 2)
        start, end = torch.dipu.Event(enable_timing=True), torch.dipu.Event(enable_timing=True)
        start.record()
        (d @ d.t()).sum()
        end.record()
        end.synchronize()
        checks["elapsed_time"] = end.query() and start.elapsed_time(end) >= 0
        torch.dipu.synchronize()
        checks["idle_stream_query"] = torch.dipu.current_stream().query() and stream.query()
        before = torch.dipu.memory_allocated()
        block = torch.empty(2**20, device="dipu")
        checks["allocated"] = torch.dipu.memory_allocated() - before == 4 * 2**20
        del block
        checks["freed"] = torch.dipu.memory_allocated() == before
        capacity = torch.dipu.get_device_properties(0).total_memory
        try:
            torch.empty(capacity + 1, dtype=torch.uint8, device="dipu")
            checks["oom"] = False
        except torch.OutOfMemoryError as error:
            checks["oom"] = "out of memory" in str(error)
        checks["usable_after_oom"] = float(torch.ones(100, device="dipu").sum()) == 100.0
        print(checks)
    """)
    checks = eval(result.stdout.strip().splitlines()[-1])
    assert all(checks.values()), checks


def test_gemm_through_clblast_equals_torch_mm_within_float32_tolerance():
    result = run_opencl("""
        import torch, ditorch.dipu as dipu
        torch.manual_seed(0)
        dipu.reset_fallback_counts()
        worst = 0.0
        for m, k, n in ((5, 7, 3), (64, 48, 32), (130, 70, 90)):
            a, b, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
            da, db, dbias = a.to("dipu"), b.to("dipu"), bias.to("dipu")
            pairs = [
                ((da @ db).cpu(), a @ b),
                ((da.t().contiguous().t() @ db.t().contiguous().t()).cpu(), a @ b),  # column-major operands
                (torch.addmm(dbias, da, db, beta=0.5, alpha=2.0).cpu(), torch.addmm(bias, a, b, beta=0.5, alpha=2.0)),
                (torch.bmm(da.expand(2, m, k).contiguous(), db.expand(2, k, n).contiguous()).cpu(),
                 torch.bmm(a.expand(2, m, k), b.expand(2, k, n))),
            ]
            for got, want in pairs:
                assert got.shape == want.shape
                worst = max(worst, float(((got - want).abs() / (want.abs() + 1)).max()))
        print(worst, sorted(dipu.fallback_counts()))
    """)
    worst, fallen = result.stdout.strip().split(" ", 1)
    assert float(worst) < 1e-5
    assert "aten::mm" not in fallen and "aten::addmm" not in fallen and "aten::bmm" not in fallen, fallen


@pytest.mark.parametrize("env, setting", [
    ({"DIPU_OPENCL_DEVICE": "nosuchdevice"}, "DIPU_OPENCL_DEVICE=nosuchdevice: no device of OpenCL platform"),
    ({"DIPU_OPENCL_DEVICE": "7"}, "DIPU_OPENCL_DEVICE=7: no device of OpenCL platform"),
    ({"DIPU_OPENCL_PLATFORM": "nosuchplatform"}, "DIPU_OPENCL_PLATFORM=nosuchplatform: no OpenCL platform matches"),
    ({"OCL_ICD_VENDORS": "/nonexistent"}, "DIPU_VENDOR=opencl: the OpenCL ICD loader finds no platform"),
])
def test_bad_settings_and_a_missing_icd_are_one_line_naming_the_setting(env, setting):
    """Never a silent fallback to the CPU: the CLI exits 2 with the one line."""
    cli = subprocess.run([sys.executable, "-m", "h2.cli.ditorch", "conformance", "--ops", "mm", "--max-samples", "1"],
                         capture_output=True, text=True, env={**os.environ, **OPENCL, **env}, timeout=300)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert cli.stderr.count("\n") == 1 and setting in cli.stderr, cli.stderr


def test_a_bad_device_setting_fails_the_first_use_of_the_device_in_a_script():
    script = run_python(
        """
        import torch, ditorch.dipu
        try:
            torch.zeros(1, device="dipu")
        except RuntimeError as error:
            print(str(error).splitlines()[0])
    """, **OPENCL, DIPU_OPENCL_DEVICE="nosuchdevice")
    assert script.returncode == 0, script.stderr
    first_platform = subprocess.run(["clinfo", "-l"], capture_output=True, text=True,
                                    check=True).stdout.splitlines()[0].split(": ", 1)[1]
    assert script.stdout.startswith("DIPU vendor opencl failed to start: DIPU_OPENCL_DEVICE=nosuchdevice: no device "
                                    f"of OpenCL platform '{first_platform}' matches (devices: 0 '"), script.stdout
    assert script.stdout.count("\n") == 1


def test_a_cuda_written_script_runs_on_opencl_after_import_ditorch():
    result = run_opencl("""
        import torch
        import ditorch

        def train(device):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
            for _ in range(3):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return loss.item(), str(x.device)

        assert torch.cuda.is_available()
        (on_cuda, where), (on_cpu, _) = train("cuda"), train("cpu")
        torch.cuda.synchronize()
        print(where, torch.cuda.get_device_name(0), abs(on_cuda - on_cpu) / on_cpu)
    """)
    where, rest = result.stdout.strip().split(" ", 1)
    name, error = rest.rsplit(" ", 1)
    clinfo = subprocess.run(["clinfo", "-l"], capture_output=True, text=True, check=True).stdout
    assert where == "dipu:0" and name in clinfo
    assert float(error) < 1e-5


def test_conformance_of_the_opencl_kernels_against_the_cpu():
    """`ditorch conformance --vendor opencl` over OpInfo samples of a few kernels (float32, which the
    vendor implements; other dtypes fall back), including a 0-dim sum, which once crashed the vendor."""
    ops = "sum,mean,_softmax,_log_softmax_backward_data,native_layer_norm,index_select,nll_loss_forward,gelu"
    result = subprocess.run([
        sys.executable, "-m", "h2.cli.ditorch", "conformance", "--vendor", "opencl", "--ops", ops, "--dtypes",
        "float32", "--max-samples", "3"
    ], capture_output=True, text=True, env={**os.environ, **OPENCL}, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "conformance of vendor opencl against the CPU" in result.stdout
    assert "tolerances (torch.testing.assert_close per dtype): float32 rtol 1.3e-06 atol 1e-05" in result.stdout
    assert "summary: 8 passed, 0 failed of 8 table checks" in result.stdout, result.stdout


def test_two_devices_are_two_contexts_with_copies_between_them():
    """pocl's POCL_DEVICES gives the platform two CPU devices: dipu:0 and dipu:1, one context each, a copy
    between them through the host, kernels on the second; DIPU_OPENCL_DEVICE=1 keeps only the second."""
    two = {"POCL_DEVICES": "pthread pthread"}
    result = run_opencl(
        """
        import torch, ditorch.dipu
        a = torch.randn(4, 5)
        x = a.to("dipu:0")
        y = x.to("dipu:1")
        with torch.dipu.device(1):
            z = torch.ones(3, device="dipu") * 2
        print(torch.dipu.device_count(), y.device, torch.equal(y.cpu(), a), torch.equal((y @ y.t()).cpu(),
              (x @ x.t()).cpu()), z.device, torch.equal(z.cpu(), torch.full((3,), 2.0)))
    """, **two)
    assert result.stdout.split() == ["2", "dipu:1", "True", "True", "dipu:1", "True"], result.stdout
    second = run_opencl("import torch, ditorch.dipu; print(torch.dipu.device_count())", DIPU_OPENCL_DEVICE="1", **two)
    assert second.stdout.strip() == "1"
