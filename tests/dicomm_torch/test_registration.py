"""`import dicomm` registers the "dicomm" torch.distributed backend for cpu and the renamed PrivateUse1 device."""
import subprocess
import sys

REPORT = ("import json, torch.distributed as d; print(json.dumps([d.Backend.backend_capability.get('dicomm'), "
          "d.Backend.default_device_backend_map.get('dipu'), 'dicomm' in d.Backend.backend_list]))")


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_registers_the_backend_for_cpu():
    assert run("import dicomm; " + REPORT) == '[["cpu"], null, true]'


def test_a_renamed_private_use_device_is_served_by_dicomm():
    code = "import torch; torch.utils.rename_privateuse1_backend('dipu'); import dicomm; " + REPORT
    assert run(code) == '[["cpu", "dipu"], "dicomm", true]'


def test_registering_again_after_a_late_rename_adds_the_device():
    code = ("import torch, dicomm; torch.utils.rename_privateuse1_backend('dipu'); "
            "dicomm.torch_backend.register(); " + REPORT)
    assert run(code) == '[["cpu", "dipu"], "dicomm", true]'


def test_loading_dipu_after_dicomm_extends_the_backend_to_dipu_by_itself():
    assert run("import dicomm, ditorch.dipu; " + REPORT) == '[["cpu", "dipu"], "dicomm", true]'
