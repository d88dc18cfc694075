"""The fault campaign's quick mode (benchmarks/faults/campaign.py) runs in CI: every case survives."""

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quick_fault_campaign_loses_nothing():
    result = subprocess.run([
        sys.executable,
        os.path.join(REPO_ROOT, "benchmarks", "faults", "campaign.py"), "--mode", "quick", "--seed", "0"
    ], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    total = [line for line in result.stdout.splitlines() if line.startswith("total")]
    assert result.returncode == 0 and total and total[0].split(
    )[-1] == "0", result.stdout[-3000:] + result.stderr[-2000:]
