"""torch.compile in a CUDA-written script on dipu, where inductor has no code generator: the
compiled model runs (eagerly, announced in one stderr line) and gives eager's results."""
import pytest
import torch
import torch.nn as nn

import ditorch


@pytest.fixture(autouse=True)
def dipu_mapped_onto_cuda():
    if ditorch.vendor() is None or ditorch.vendor().name != "dipu":
        ditorch.use("dipu")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).cuda()


def test_a_compiled_model_on_cuda_trains_on_dipu_with_eager_results():
    model = small_model()
    x = torch.randn(3, 8, device="cuda")
    compiled_out = torch.compile(model)(x)
    compiled_out.sum().backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    eager_out = model(x)
    eager_out.sum().backward()
    assert compiled_out.device.type == "dipu"
    assert torch.equal(compiled_out, eager_out)
    assert all(torch.equal(a, p.grad) for a, p in zip(compiled_grads, model.parameters()))


def test_the_eager_fallback_is_announced_in_one_stderr_line(capfd):
    model = torch.compile(small_model())
    for _ in range(3):
        model(torch.randn(2, 8, device="cuda"))
    lines = [line for line in capfd.readouterr().err.splitlines() if "torch.compile" in line]
    assert lines == [
        "ditorch: torch.compile: inductor has no code generator for the dipu device; "
        "its graphs run eagerly (backend 'eager')"
    ]


def test_the_decorator_form_with_a_mode_runs_on_dipu():

    @torch.compile(mode="max-autotune", fullgraph=True)
    def scaled_tanh(x):
        return torch.tanh(x) * 2

    x = torch.randn(5, device="cuda")
    assert torch.equal(scaled_tanh(x), torch.tanh(x) * 2)
