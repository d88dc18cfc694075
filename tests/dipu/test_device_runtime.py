"""The dipu device as PyTorch sees it: registration, devices, streams, events, random state."""
import pytest
import torch

import ditorch.dipu as dipu


def test_device_is_registered_under_the_name_dipu():
    assert torch._C._get_privateuse1_backend_name() == "dipu"
    assert torch.device("dipu").type == "dipu"
    assert torch.dipu.is_available()


def test_torch_accelerator_reports_dipu():
    assert torch.accelerator.current_accelerator().type == "dipu"
    assert torch.accelerator.device_count() == torch.dipu.device_count()


def test_tensor_and_module_methods_move_to_dipu():
    x = torch.arange(6.0).reshape(2, 3)
    y = x.dipu()
    assert y.is_dipu and not x.is_dipu
    assert y.device == torch.device("dipu", 0)
    module = torch.nn.Linear(3, 2).dipu()
    assert module.weight.is_dipu


def test_host_vendor_has_two_emulated_devices_with_properties():
    assert dipu.vendor_name() == "host"
    assert torch.dipu.device_count() == 2
    properties = torch.dipu.get_device_properties(1)
    assert properties.name == "host-emulated (default)"
    assert properties.total_memory == 16 * 2**30
    assert properties.host_accessible


def test_set_device_and_device_context_choose_where_tensors_go():
    assert torch.dipu.current_device() == 0
    with torch.dipu.device(1):
        assert torch.dipu.current_device() == 1
        assert torch.ones(2, device="dipu").device.index == 1
    assert torch.dipu.current_device() == 0
    torch.dipu.set_device(1)
    try:
        assert torch.empty(1, device="dipu").device.index == 1
    finally:
        torch.dipu.set_device(0)


def test_unknown_device_index_is_an_error():
    with pytest.raises(RuntimeError, match="dipu device 5 does not exist"):
        torch.dipu.set_device(5)


def test_events_measure_elapsed_time_on_a_stream():
    stream = torch.dipu.Stream()
    start, end = torch.dipu.Event(enable_timing=True), torch.dipu.Event(enable_timing=True)
    with torch.dipu.stream(stream):
        assert torch.dipu.current_stream() == stream
        start.record()
        a = torch.randn(256, 256, device="dipu")
        (a @ a).sum().item()
        end.record()
    end.synchronize()
    assert stream.query()
    assert start.elapsed_time(end) > 0
    assert torch.dipu.current_stream() != stream
    torch.dipu.synchronize()


def test_manual_seed_makes_dipu_random_numbers_match_the_cpu():
    torch.manual_seed(123)
    on_cpu = torch.randn(5, 7)
    torch.manual_seed(123)
    on_dipu = torch.randn(5, 7, device="dipu")
    assert torch.equal(on_dipu.cpu(), on_cpu)


def test_rng_state_round_trips():
    torch.dipu.manual_seed(7)
    state = torch.dipu.get_rng_state()
    first = torch.rand(4, device="dipu").cpu()
    torch.dipu.set_rng_state(state)
    assert torch.equal(torch.rand(4, device="dipu").cpu(), first)
    assert torch.dipu.initial_seed() == 7


def test_pinned_memory_comes_from_the_vendor():
    pinned = torch.ones(16).pin_memory()
    assert pinned.is_pinned()
    assert not torch.ones(16).is_pinned()
    assert torch.equal(pinned.to("dipu", non_blocking=True).cpu(), torch.ones(16))


def test_default_stream_is_stream_zero_and_current_until_changed():
    assert torch.dipu.default_stream().stream_id == 0
    assert torch.dipu.current_stream() == torch.dipu.default_stream()
