"""python -m dicomm.bench --quick runs end to end and writes the documented JSON."""
import json
import subprocess
import sys

import pytest


def test_the_quick_benchmark_reports_every_transport_gloo_and_memcpy(tmp_path):
    pytest.importorskip("torch.distributed")
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "dicomm.bench", "--quick", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["transport"] for r in rows} >= {"shm", "tcp", "gloo", "memcpy"}
    for r in rows:
        assert set(r) == {"transport", "bytes", "latency_us", "bandwidth_GBps"}
        assert r["latency_us"] > 0 and r["bandwidth_GBps"] >= 0
    assert "shm/gloo" in run.stdout
    assert "shm 4 KiB latency / gloo" in run.stdout


@pytest.mark.slow
def test_the_quick_torch_benchmark_measures_dicomm_beside_gloo(tmp_path):
    out = tmp_path / "bench-torch.json"
    run = subprocess.run([sys.executable, "-m", "dicomm.bench", "--torch", "--quick", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    tests = {(r["test"], r["backend"]) for r in rows}
    for test in ("send/recv", "batch_isend_irecv", "all_reduce x4"):
        assert {(test, "dicomm"), (test, "gloo")} <= tests
    assert all(r["latency_us"] > 0 for r in rows)
    assert "send/recv 4 KiB latency dicomm/gloo" in run.stdout
