"""Inside `torch.autocast("cuda")` on a mapped vendor, torch's autocast state functions asked about
"cuda" (or, in their legacy forms, about nothing, which means CUDA) answer for the vendor's device."""
import pytest
import torch

import ditorch


@pytest.fixture(autouse=True)
def dipu_mapped_onto_cuda():
    if ditorch.vendor() is None or ditorch.vendor().name != "dipu":
        ditorch.use("dipu")


def test_autocast_cuda_is_reported_enabled_with_its_dtype():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16
    assert not torch.is_autocast_enabled("cuda")


def test_the_legacy_queries_without_a_device_mean_cuda():
    with torch.cuda.amp.autocast(dtype=torch.float16):
        assert torch.is_autocast_enabled()
        assert torch.get_autocast_gpu_dtype() == torch.float16


def test_autocast_is_available_for_cuda():
    assert torch.amp.is_autocast_available("cuda")
