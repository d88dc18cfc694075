"""Device-argument translation, checked against a CPU target so it runs without any accelerator."""

import pytest
import torch

import ditorch
from ditorch.device_args import DeviceArguments, DeviceTranslator


@pytest.fixture(autouse=True)
def plain_torch():
    """Each test installs its own mapping on plain torch; the process-wide one comes back after."""
    active = ditorch.vendor()
    ditorch.deactivate()
    yield
    if active is not None:
        ditorch.use(active.name)


def test_cuda_names_and_the_unified_name_translate_to_the_vendor():
    translate = DeviceTranslator("dipu")
    assert translate("cuda") == "dipu"
    assert translate("cuda:1") == "dipu:1"
    assert translate("device") == "dipu"
    assert DeviceTranslator("cpu")(torch.device("cuda", 2)) == torch.device("cpu", 2)
    assert translate("cpu") == "cpu" and translate(None) is None and translate(3) == 3


def test_factories_and_to_follow_the_mapping_and_undo_restores_torch():
    original_zeros, original_to = torch.zeros, torch.Tensor.to
    mapping = DeviceArguments("cpu")
    mapping.apply()
    try:
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.randn(4, 4, device="device").device.type == "cpu"
        assert torch.ones(1).to("cuda:0").device.type == "cpu"
        assert torch.ones(1).cuda().device.type == "cpu"
        assert torch.nn.Linear(2, 2).cuda().weight.device.type == "cpu"
        assert torch.ones(1).is_cuda
    finally:
        mapping.undo()
    assert torch.zeros is original_zeros
    assert torch.Tensor.to is original_to
    assert "to" not in torch.Tensor.__dict__ and "is_cuda" not in torch.Tensor.__dict__
    assert not torch.ones(1).is_cuda


def test_autocast_and_grad_scaler_accept_cuda_as_their_device():
    mapping = DeviceArguments("cpu")
    mapping.apply()
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            product = torch.ones(2, 2) @ torch.ones(2, 2)
        assert product.dtype == torch.bfloat16
        assert torch.amp.GradScaler("cuda")._device == "cpu"
    finally:
        mapping.undo()
