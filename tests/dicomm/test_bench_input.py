"""benchmarks/dicomm/bench.py: bad sizes, an output file it could not write and DiComm settings the ranks
would refuse are one line and exit status 2 before any rank starts; a failed target is a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO_ROOT, "benchmarks", "dicomm")

CASES = [
    (["--sizes", "0"], {}, "--sizes 0: message sizes must be between 1 and"),
    (["--sizes", str(2**70)], {}, "message sizes must be between 1 and"),
    (["--sizes", ""], {}, "--sizes : not a comma-separated list"),
    (["--quick", "--json", "{binary}/x.json"], {}, "--json"),
    (["--quick", "--json", "{folder}"], {}, "is a folder"),
    (["--torch", "--sizes", "0"], {}, "--sizes 0"),
    (["--device", "dipu", "--sizes", "0"], {}, "--sizes 0"),
    (["--quick", "--transports", "tcp", "--sizes",
      "8"], {"DICOMM_TCP_CONGESTION": "bogus"}, "DICOMM_TCP_CONGESTION=bogus: refused by the kernel"),
    (["--quick", "--transports", "tcp", "--sizes",
      "8"], {"DICOMM_MAX_MESSAGE_BYTES": "0"}, "DICOMM_MAX_MESSAGE_BYTES=0 is below the largest message size 8"),
]


@pytest.mark.parametrize("argv, env, expected", CASES, ids=[" ".join(argv) + "".join(env) for argv, env, _ in CASES])
def test_bad_input_to_the_dicomm_bench_is_one_line_before_any_rank_starts(tmp_path, argv, env, expected):
    binary = tmp_path / "binary"
    binary.write_bytes(b"\0")
    argv = [part.format(binary=binary, folder=tmp_path) for part in argv]
    started = time.monotonic()
    result = subprocess.run([sys.executable, os.path.join(BENCH, "bench.py"), *argv], capture_output=True, text=True,
                            timeout=300, env={**os.environ, **env}, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("dicomm.bench: error: ") and expected in lines[0], lines[0]
    assert time.monotonic() - started < 60 and "one-way latency" not in result.stdout  # no rank ran


def test_a_failed_target_makes_the_report_exit_non_zero(capsys):
    sys.path.insert(0, BENCH)
    try:
        from common import report
    finally:
        sys.path.remove(BENCH)
    assert report([], "table", ["PASS a (target >= 1)", "FAIL b (target >= 2)"], None) == 1
    assert report([], "table", ["PASS a (target >= 1)"], None) == 0
    assert "FAIL b" in capsys.readouterr().out
