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
