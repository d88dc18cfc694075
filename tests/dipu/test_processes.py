"""dipu tensors and other processes: a tensor sent to a worker is refused in one line (this device
shares no memory between processes), and a child forked after the device was used may not use it
(its writes would stay in the child), as with CUDA."""
import json
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


@pytest.mark.parametrize("vendor, why", [
    ("opencl", "the opencl vendor shares no device memory between processes (it exports no memory handles "
     "(dipuIpcGetMemHandle): OpenCL 1.2 cannot hand a cl_mem to another process)"),
    ("host", "the host vendor shares no device memory between processes (its memory handles serve DiComm's "
     "transfers only, not torch's pickling)"),
])
def test_every_path_that_would_share_dipu_memory_with_another_process_is_one_line_naming_the_vendor(
        python_in_subprocess, vendor, why):
    result = python_in_subprocess(
        """
        import json, torch, ditorch.dipu
        from multiprocessing.reduction import ForkingPickler
        t = torch.ones(4, device="dipu")
        paths = {"pickle tensor": lambda: ForkingPickler.dumps(t),
                 "pickle untyped storage": lambda: ForkingPickler.dumps(t.untyped_storage()),
                 "pickle typed storage": lambda: ForkingPickler.dumps(t.storage()),
                 "_share_cuda_": lambda: t.untyped_storage()._share_cuda_(),
                 "_share_fd_cpu_": lambda: t.untyped_storage()._share_fd_cpu_(),
                 "_share_filename_cpu_": lambda: t.untyped_storage()._share_filename_cpu_()}
        answers = {}
        for name, path in paths.items():
            try:
                path()
                answers[name] = None
            except Exception as error:
                answers[name] = [type(error).__name__, str(error)]
        cpu = torch.ones(2).share_memory_()
        shared = cpu.untyped_storage()._share_fd_cpu_()
        answers["cpu still shared"] = len(ForkingPickler.dumps(cpu)) > 0 and shared is not None
        print(json.dumps(answers))
    """, DIPU_VENDOR=vendor)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert answers.pop("cpu still shared") is True
    for name, answer in answers.items():
        assert answer is not None, f"{name} was not refused"
        kind, message = answer
        what = "tensor" if name == "pickle tensor" else "storage"
        assert kind == "DipuError" and "\n" not in message, (name, answer)
        assert message.startswith(f"a dipu {what} cannot be sent to another process: {why}; send tensor.cpu()"), answer
