"""Convolutions on the OpenCL vendor (no diopiConvolution): computed on the CPU instead of raising
NotImplementedError (ditorch.dipu.conv_fallback), forward and backward, as the CPU computes them."""
import json

from conftest import run_python

CONVOLUTIONS = """
    import copy, json, torch, ditorch.dipu as dipu
    from ditorch.dipu import conv_fallback
    torch.manual_seed(0)
    results = {"vendor": dipu.vendor_name(), "cpu_kernels": conv_fallback._library is not None}
    for module, shape in ((torch.nn.Conv2d(3, 4, 3, padding=1), (2, 3, 8, 8)), (torch.nn.Conv1d(3, 4, 3, stride=2),
                          (2, 3, 9)), (torch.nn.ConvTranspose2d(4, 2, 3, groups=2), (1, 4, 5, 5))):
        x = torch.randn(*shape)
        y = module(x)
        y.square().sum().backward()
        on_dipu = copy.deepcopy(module)
        on_dipu.zero_grad()
        on_dipu = on_dipu.to("dipu")
        xd = x.to("dipu").requires_grad_()
        yd = on_dipu(xd)
        yd.square().sum().backward()
        results[type(module).__name__] = [float((yd.cpu() - y).abs().max()), float((on_dipu.weight.grad.cpu() -
                                          module.weight.grad).abs().max()), float((on_dipu.bias.grad.cpu() -
                                          module.bias.grad).abs().max()), yd.device.type]
    print(json.dumps(results))
"""


def convolutions(vendor: str) -> dict:
    result = run_python(CONVOLUTIONS, DIPU_VENDOR=vendor)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_convolutions_on_opencl_run_on_the_cpu_and_match_it():
    results = convolutions("opencl")
    assert results["vendor"] == "opencl" and results["cpu_kernels"]
    for name in ("Conv2d", "Conv1d", "ConvTranspose2d"):
        *errors, device = results[name]
        assert device == "dipu" and max(errors) < 1e-5, (name, results[name])


def test_the_host_vendor_keeps_its_own_convolution():
    results = convolutions("host")
    assert results["vendor"] == "host" and not results["cpu_kernels"]
    assert max(results["Conv2d"][:3]) < 1e-4
