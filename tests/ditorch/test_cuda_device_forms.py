"""With dipu mapped onto CUDA, every device form torch accepts ("cuda", "cuda:N", torch.device, an int)
works wherever a CUDA script passes one: torch.cuda functions and classes, the Tensor.new_* factories
and the default device (`with torch.device(...)`, torch.set_default_device)."""
import pytest
import torch
import torch.nn as nn

import ditorch

FORMS_OF_DEVICE_1 = ["cuda:1", torch.device("cuda", 1), torch.device("cuda:1"), 1]


@pytest.fixture(autouse=True)
def dipu_mapped_onto_cuda():
    if ditorch.vendor() is None or ditorch.vendor().name != "dipu":
        ditorch.use("dipu")
    torch.cuda.set_device(0)
    yield
    torch.cuda.set_device(0)


@pytest.mark.parametrize("device", FORMS_OF_DEVICE_1, ids=str)
def test_set_device_takes_every_form(device):
    torch.cuda.set_device(device)
    assert torch.cuda.current_device() == 1


@pytest.mark.parametrize("name", [
    "synchronize", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats",
    "reset_peak_memory_stats", "get_device_properties", "get_device_name", "get_device_capability", "mem_get_info",
    "get_rng_state"
])
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 1)], ids=str)
def test_device_queries_take_cuda_names(name, device):
    named_index = 0 if device == "cuda" else 1
    on_device_1 = torch.empty(1 << 20, dtype=torch.uint8, device="dipu:1")  # device 1's memory answers differ
    answer = comparable(getattr(torch.cuda, name)(device))
    assert answer == comparable(getattr(torch.cuda, name)(torch.device("dipu", named_index)))
    del on_device_1


def comparable(answer):
    """A query's answer in a form `==` compares by value (RNG states are tensors, properties have no __eq__)."""
    return answer.tolist() if isinstance(answer, torch.Tensor) else repr(answer)


@pytest.mark.parametrize("device", FORMS_OF_DEVICE_1, ids=str)
def test_streams_land_on_the_named_device(device):
    assert torch.cuda.Stream(device=device).device_index == 1
    assert torch.cuda.current_stream(device).device_index == 1
    assert torch.cuda.default_stream(device).device_index == 1


def test_the_device_context_takes_a_cuda_name():
    with torch.cuda.device("cuda:1"):
        assert torch.cuda.current_device() == 1
        assert torch.empty(1, device="cuda").device == torch.device("dipu", 1)
    assert torch.cuda.current_device() == 0


def test_rng_state_round_trips_through_a_cuda_name():
    state = torch.cuda.get_rng_state("cuda:1")
    first = torch.rand(3, device="cuda:1")
    torch.cuda.set_rng_state(state, "cuda:1")
    assert torch.equal(torch.rand(3, device="cuda:1").cpu(), first.cpu())


@pytest.mark.parametrize("make", [
    lambda t: t.new_zeros((2, ), device="cuda"), lambda t: t.new_ones((2, ), device="cuda"), lambda t: t.new_empty(
        (2, ), device="cuda"), lambda t: t.new_full((2, ), 3.0, device="cuda"),
    lambda t: t.new_tensor([1.0, 2.0], device="cuda"), lambda t: t.new_empty_strided((2, ), (1, ), device="cuda")
], ids=["new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "new_empty_strided"])
def test_tensor_new_factories_take_cuda(make):
    assert make(torch.ones(1)).device.type == "dipu"


def test_with_torch_device_cuda_builds_modules_on_the_vendor():
    with torch.device("cuda"):
        layer = nn.Linear(2, 2)
        buffer = torch.zeros(3)
    assert layer.weight.device.type == "dipu" and buffer.device.type == "dipu"


def test_with_torch_device_meta_builds_meta_tensors():
    with torch.device("meta"):
        layer = nn.Linear(2, 2)
        buffer = torch.zeros(3)
    assert layer.weight.is_meta and buffer.is_meta


def test_set_default_device_takes_a_cuda_name():
    torch.set_default_device("cuda:1")
    try:
        assert torch.ones(1).device == torch.device("dipu", 1)
    finally:
        torch.set_default_device(None)
    assert torch.ones(1).device.type == "cpu"
