"""Acceptance: the project's LLaMA-style model (h2.model) trains on dipu with a loss log bit-identical to the CPU."""
import io

import torch

import ditorch.dipu as dipu
from training import train_with_checkpoint

CPU_LOSSES = None


def cpu_losses():
    global CPU_LOSSES
    if CPU_LOSSES is None:
        CPU_LOSSES = train_with_checkpoint("cpu")
    return CPU_LOSSES


def test_training_on_dipu_is_bit_identical_to_cpu():
    losses = train_with_checkpoint("dipu")
    assert losses == cpu_losses()
    assert losses[-1] < losses[0]


def test_training_without_host_access_is_bit_identical_to_cpu(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu
        from training import train_with_checkpoint
        assert not torch.dipu.get_device_properties(0).host_accessible
        print(repr(train_with_checkpoint("dipu")))
    """, DIPU_HOST_PROFILE="discrete")
    assert result.returncode == 0, result.stderr
    assert eval(result.stdout.strip()) == cpu_losses()


def test_reduced_precision_profile_changes_the_losses_slightly(python_in_subprocess):
    result = python_in_subprocess(
        """
        import ditorch.dipu
        from training import train_with_checkpoint
        print(repr(train_with_checkpoint("dipu")))
    """, DIPU_HOST_PROFILE="lowprec")
    assert result.returncode == 0, result.stderr
    losses = eval(result.stdout.strip())
    assert losses != cpu_losses()
    assert max(abs(a - b) for a, b in zip(losses, cpu_losses())) < 1e-2


def test_the_training_step_runs_its_heavy_operators_through_diopi():
    dipu.reset_fallback_counts()
    train_with_checkpoint("dipu", steps=2)
    fallen = dipu.fallback_counts()
    for operator in ("aten::mm", "aten::addmm", "aten::_softmax", "aten::_log_softmax",
                     "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::mul.Tensor", "aten::add.Tensor"):
        assert operator not in fallen, fallen


def test_checkpoint_saved_on_dipu_loads_on_cpu():
    weights = torch.nn.Linear(4, 3).to("dipu").state_dict()
    buffer = io.BytesIO()
    torch.save(weights, buffer)
    buffer.seek(0)
    on_dipu = torch.load(buffer)
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_dipu["weight"].is_dipu and on_cpu["weight"].device.type == "cpu"
    assert torch.equal(on_dipu["weight"].cpu(), on_cpu["weight"])
    assert torch.equal(weights["bias"].cpu(), on_cpu["bias"])
