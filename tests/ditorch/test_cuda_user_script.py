"""Acceptance: a CUDA-written training script runs unchanged on dipu once `import ditorch` is added."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "cuda_user_scripts", "train_cuda.py")


def script_with_ditorch(tmp_path) -> str:
    """The user's script with one line added at the top: `import ditorch`."""
    with open(SCRIPT, encoding="utf-8") as handle:
        source = handle.read()
    path = tmp_path / "train_cuda_ditorch.py"
    path.write_text("import ditorch\n" + source)
    return str(path)


def run(args, timeout=240):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)


def results(stdout: str) -> list[dict]:
    return [json.loads(line[len("result "):]) for line in stdout.splitlines() if line.startswith("result ")]


def test_without_ditorch_it_fails_as_on_a_machine_without_cuda():
    completed = run([SCRIPT, "--steps", "2"])
    assert completed.returncode != 0
    assert "Torch not compiled with CUDA enabled" in completed.stderr


def test_with_import_ditorch_it_trains_on_dipu(tmp_path):
    completed = run([script_with_ditorch(tmp_path), "--steps", "12"])
    assert completed.returncode == 0, completed.stderr[-2000:]
    (result, ) = results(completed.stdout)
    assert result["device"] == "dipu:0"
    assert result["cuda_available"] is True and result["device_count"] >= 1
    assert result["max_memory_allocated"] > 0 and result["elapsed_ms"] > 0
    assert result["last_loss"] < 0.7 * result["first_loss"]


@pytest.mark.slow
def test_ddp_under_torchrun_with_nccl_trains_on_dipu_and_keeps_replicas_equal(tmp_path):
    completed = run([
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        script_with_ditorch(tmp_path), "--steps", "6"
    ], timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    by_rank = {r["rank"]: r for r in results(completed.stdout)}
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0]["device"] == "dipu:0" and by_rank[1]["device"] == "dipu:1"
    assert by_rank[0]["checksum"] == pytest.approx(by_rank[1]["checksum"], rel=0, abs=1e-9)
    assert by_rank[0]["first_loss"] != by_rank[1]["first_loss"]  # each rank saw its own data
    assert by_rank[0]["last_loss"] < by_rank[0]["first_loss"]


def test_ditorch_info_names_the_vendor_every_adapter_and_the_mappings():
    completed = run(["-m", "h2.cli.ditorch", "info", "--json"])
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["vendor"] == "dipu" and report["cuda_mapped"]
    assert set(report["adapters"]) == {"cuda", "npu", "mlu", "musa", "xpu", "dipu"}
    assert report["mappings"]["torch.cuda"]["torch.cuda.max_memory_allocated"] == "torch.dipu.max_memory_allocated"
    assert report["mappings"]["distributed_backend_for_nccl"].startswith("cpu:gloo,dipu:")
