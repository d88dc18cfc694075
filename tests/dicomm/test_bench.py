"""python benchmarks/dicomm/bench.py --quick runs end to end and writes the documented JSON; bad input is refused
before any worker starts."""
import json
import os
import subprocess
import sys

import pytest

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks",
                         "dicomm")
BENCH = os.path.join(BENCH_DIR, "bench.py")
sys.path.insert(0, BENCH_DIR)  # the benchmark's modules import their siblings, as they do when run as a script
import bench  # noqa: E402


def assert_exit_follows_the_verdicts(run: subprocess.CompletedProcess) -> None:
    """The report is complete either way; the exit status is 1 exactly when a target line says FAIL (the
    quick run's few repeats on a loaded host may miss a latency target)."""
    failed = any(line.startswith("FAIL") for line in run.stdout.splitlines())
    assert run.returncode == (1 if failed else 0), run.stdout[-2000:] + run.stderr[-2000:]


def test_the_quick_benchmark_reports_every_transport_gloo_and_memcpy(tmp_path):
    pytest.importorskip("torch.distributed")
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, BENCH, "--quick", "--json",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert_exit_follows_the_verdicts(run)
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
    run = subprocess.run([sys.executable, BENCH, "--torch", "--quick", "--json",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert_exit_follows_the_verdicts(run)
    rows = json.loads(out.read_text())["rows"]
    tests = {(r["test"], r["backend"]) for r in rows}
    for test in ("send/recv", "batch_isend_irecv", "all_reduce x4"):
        assert {(test, "dicomm"), (test, "gloo")} <= tests
    assert all(r["latency_us"] > 0 for r in rows)
    assert "send/recv 4 KiB latency dicomm/gloo" in run.stdout


@pytest.mark.parametrize("args, env, message", [
    (["--sizes", "-1"], {}, "--sizes -1: message sizes must be between 1 and 1073741824 bytes"),
    (["--sizes", "x"], {}, "not a comma-separated list"),
    ([], {"DICOMM_SHM_RING_BYTES": "3"}, "shm ring size must be a power of two"),
    ([], {"DICOMM_TIMEOUT_S": "abc"}, "DICOMM_TIMEOUT_S=abc is not a positive number"),
    ([], {"DICOMM_BIND_ADDR": "not-an-ip"}, "'not-an-ip' is not an IPv4 address (DICOMM_BIND_ADDR)"),
    ([], {"DICOMM_TCP_CHUNK_BYTES": "0"}, "tcp chunk size must lie in"),
    ([], {"DICOMM_TCP_CONGESTION": "re no"}, "tcp congestion control 're no' is not a kernel algorithm name"),
    ([], {"DICOMM_HELLO_TIMEOUT_S": "0"}, "DICOMM_HELLO_TIMEOUT_S=0 is not a positive number"),
])
def test_bad_benchmark_input_is_one_line_and_exit_2_before_any_worker_starts(capsys, monkeypatch, args, env, message):

    def workers_started(*_, **__):
        raise AssertionError("the benchmark's workers started before its bad input was refused")

    monkeypatch.setattr(bench, "run_ranks", workers_started)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = bench.main(["--quick", "--transports", "tcp", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dicomm.bench: error: ") and message in lines[0]
