"""dipu tensors and other processes: a tensor sent to a worker is refused in one line (this device
shares no memory between processes), and a child forked after the device was used may not use it
(its writes would stay in the child), as with CUDA."""
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from ditorch.dipu import DipuError


def test_sending_a_dipu_tensor_to_a_worker_process_is_refused_naming_what_to_do():
    model = torch.nn.Linear(2, 2).to("dipu").share_memory()
    with pytest.raises(DipuError, match="a dipu tensor cannot be sent to another process: .* send tensor.cpu()"):
        ForkingPickler.dumps(model.weight)


def test_cpu_tensors_still_go_to_workers_through_shared_memory():
    tensor = torch.ones(3).share_memory_()
    assert len(ForkingPickler.dumps(tensor)) > 0


def test_a_child_forked_after_the_device_was_used_is_refused_the_device(python_in_subprocess):
    result = python_in_subprocess("""
        import os, torch, ditorch.dipu
        x = torch.ones(2, device="dipu")
        pid = os.fork()
        if pid == 0:
            try:
                torch.ones(1, device="dipu")
                os._exit(0)
            except RuntimeError as error:
                print(str(error).splitlines()[0], flush=True)
                os._exit(3)
        print("child exit", os.waitpid(pid, 0)[1] >> 8, "parent still works", (x + 1).sum().item())
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("dipu cannot be used in a process forked after the device was first used")
    assert lines[1] == "child exit 3 parent still works 4.0"
