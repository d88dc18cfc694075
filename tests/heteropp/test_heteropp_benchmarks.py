"""The HeteroPP benchmark scripts run end to end on tiny settings (their numbers are not checked here:
timing belongs to the benchmarks themselves, on a quiet machine)."""

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow


def test_the_resharding_benchmark_reports_both_layouts_and_half_the_bytes_for_sliced():
    script = os.path.join(REPO_ROOT, "benchmarks", "bench_resharding.py")
    run = subprocess.run([
        sys.executable, script, "--rounds", "1", "--steps", "1", "--transfer-mib", "1", "--hidden", "64", "--seq-len",
        "32", "--micro-batch-size", "2", "--micro-batches", "2"
    ], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    for layout in ("uniform", "topology"):
        assert f"{layout}: PASS fewer bytes across stages" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.strip().startswith("1 MiB activation")]
    assert len(rows) == 2  # one transfer row per layout
