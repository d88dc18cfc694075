"""Moving a module between the CPU and dipu keeps its Parameter objects, as a move to CUDA does: an
optimizer built before the move trains the moved model, and tied weights stay one tensor."""
import torch
import torch.nn as nn

import ditorch.dipu  # noqa: F401  registers the dipu device


def tied_language_model() -> nn.Module:
    model = nn.ModuleDict({"embedding": nn.Embedding(10, 4), "head": nn.Linear(4, 10, bias=False)})
    model["head"].weight = model["embedding"].weight
    return model


def test_moving_a_module_to_dipu_keeps_its_parameter_objects():
    model = nn.Linear(3, 2)
    before = list(model.parameters())
    model.to("dipu")
    assert all(p is q for p, q in zip(model.parameters(), before))
    assert all(p.device.type == "dipu" for p in before)


def test_moving_back_to_the_cpu_keeps_them_too():
    model = nn.Linear(3, 2).to("dipu")
    weight = model.weight
    model.cpu()
    assert model.weight is weight and weight.device.type == "cpu"


def test_tied_weights_stay_one_parameter_after_the_move():
    model = tied_language_model().to("dipu")
    assert model["head"].weight is model["embedding"].weight
    assert sum(p.numel() for p in model.parameters()) == 40


def test_an_optimizer_built_before_the_move_updates_the_moved_model():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("dipu")
    start = model.weight.detach().cpu().clone()
    model(torch.ones(2, 3, device="dipu")).sum().backward()
    optimizer.step()
    assert not torch.equal(model.weight.detach().cpu(), start)


def test_gradients_move_with_their_parameters():
    model = nn.Linear(3, 1)
    model(torch.ones(2, 3)).sum().backward()
    grad = model.weight.grad
    model.to("dipu")
    assert model.weight.grad is grad and grad.device.type == "dipu"
