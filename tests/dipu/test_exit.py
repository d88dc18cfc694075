"""A process that ends right after a backward on dipu exits cleanly. Before the fix such a run
aborted (`terminate called without an active exception`, exit status 134) whenever the interpreter
began to finalize before autograd's dipu worker had let go of the finished backward: about half the
runs, and four in five when the main thread keeps the GIL (a long switch interval, as here)."""
import os
import subprocess
import sys

ENDS_AFTER_BACKWARD = """
import sys, torch, ditorch.dipu
sys.setswitchinterval(100)
model = torch.nn.Linear(64, 64).to("dipu")
model(torch.randn(32, 64, device="dipu")).sum().backward()
"""
RUNS = 4


def test_a_script_ending_right_after_a_backward_exits_with_status_zero_every_time():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen([sys.executable, "-c", ENDS_AFTER_BACKWARD], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True) for _ in range(RUNS)
    ]
    outcomes = [(process.wait(timeout=300), process.stderr.read()[-300:]) for process in processes]
    assert [code for code, _ in outcomes] == [0] * RUNS, outcomes
