"""`heteroauto profile`: measure a chip type's per-layer times and activation memory through torch.

Times one h2 decoder layer (h2.model.DecoderLayer) at TP size 1 on the given device: forward,
forward+backward (backward = the difference), and a recompute (a second forward). Activation bytes
are the tensors autograd saves for backward (counted once per storage); with recompute a layer keeps
only its input. The optimizer time is one Adam step over the layer's parameters. TP sizes above 1,
and dp > 1 update times, cannot be measured on one device: they are derived (compute / (tp * tp
efficiency) + the TP all-reduces, and the gradient synchronisation from the cluster's links), and the
profile's `assumptions` say so. The only module of heteropp.auto that imports torch.
"""

from __future__ import annotations

import time

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from heteropp.auto.profiles import (LayerProfile, Profile, UpdateProfile, activation_entry_bytes, dp_sizes,
                                    tp_collective_s, update_s_per_layer)
from h2.core.cluster import ChipType, TrainingSpec


def _synchronize(torch, device) -> None:
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "synchronize") and device.type != "cpu":
        module.synchronize()


def _timed(torch, device, fn, repeats: int) -> float:
    fn()  # warm-up
    _synchronize(torch, device)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        _synchronize(torch, device)
        best = min(best, time.perf_counter() - started)
    return best


def saved_activation_bytes(torch, layer, hidden) -> int:
    """Bytes of the distinct storages autograd keeps for this layer's backward."""
    storages: dict[int, int] = {}
    parameters = {p.untyped_storage().data_ptr() for p in layer.parameters()}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(hidden)
    return sum(storages.values())


def measure_profile(chip: ChipType, model: ModelConfig, training: TrainingSpec, *, device: str = "cpu",
                    repeats: int = 3) -> Profile:
    try:
        import torch
    except ImportError:
        raise UserError("heteroauto profile: torch is not installed (use --synthesise)") from None
    try:
        from h2.model import DecoderLayer
    except (ImportError, AttributeError):
        raise UserError("heteroauto profile: h2.model.transformer (DecoderLayer) is not available in this "
                        "checkout (use --synthesise)") from None
    try:
        torch_device = torch.device(device)
        torch.empty(1, device=torch_device)
    except (RuntimeError, ValueError) as error:
        raise UserError(f"--device: cannot use torch device '{device}': {str(error).splitlines()[0]}") from None
    dtype = torch.bfloat16 if training.activation_bytes_per_element == 2 else torch.float32
    torch.manual_seed(0)
    layer = DecoderLayer(model).to(device=torch_device, dtype=dtype)
    shape = (training.micro_batch_size, training.seq_len, model.hidden_size)
    hidden = torch.randn(shape, device=torch_device, dtype=dtype, requires_grad=True)
    grad = torch.randn(shape, device=torch_device, dtype=dtype)

    def forward():
        with torch.no_grad():
            layer(hidden)

    def forward_backward():
        layer(hidden).backward(grad)

    forward_s = _timed(torch, torch_device, forward, repeats)
    backward_s = max(_timed(torch, torch_device, forward_backward, repeats) - forward_s, 0.0)
    activation_bytes = saved_activation_bytes(torch, layer, hidden)
    kept_bytes = hidden.numel() * hidden.element_size()

    master = [p.detach().float().clone().requires_grad_(True) for p in layer.parameters()]
    for p in master:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.Adam(master, lr=1e-4)
    optimizer_s = _timed(torch, torch_device, optimizer.step, repeats)

    layers, update = [], []
    for tp in chip.tp_sizes():
        collective = tp_collective_s(model, training, chip, tp)
        slowdown = tp * chip.tp_compute_efficiency(tp)
        analytic_full, _ = activation_entry_bytes(model, training, tp)
        analytic_tp1, _ = activation_entry_bytes(model, training, 1)
        scaled_activation = int(activation_bytes * analytic_full / analytic_tp1)
        layers.append(LayerProfile(tp=tp, forward_s=forward_s / slowdown + 2 * collective,
                                   backward_s=backward_s / slowdown + 2 * collective,
                                   recompute_s=forward_s / slowdown + 2 * collective,
                                   activation_bytes=scaled_activation, recompute_activation_bytes=kept_bytes))
        for dp in dp_sizes(chip, tp):
            update.append(UpdateProfile(dp=dp, tp=tp, seconds_per_layer=update_s_per_layer(
                model, training, chip, dp, tp, optimizer_s_at_dp1=optimizer_s / tp)))
    assumptions = [
        f"measured on torch device '{device}' at tp=1 in {str(dtype).replace('torch.', '')}: forward, "
        f"forward+backward (backward = difference), recompute = forward; best of {repeats}",
        "activation bytes: distinct storages saved by autograd for one layer (tp=1); other tp sizes scaled by "
        "h2.model.config's tp-sharded accounting; recompute keeps the layer input only",
        f"tp > 1 derived: time / (tp x {chip.tp_efficiency_per_doubling:g} per doubling) + 2 ring all-reduces per "
        f"pass over {chip.intra_node_gbps:g} GB/s",
        f"update: measured Adam step over one layer (fp32 master copy) / tp / dp (ZeRO-1) + gradient sync over "
        f"{chip.inter_node_gbps:g} GB/s inter-node, not overlapped",
    ]
    if chip.emulated:
        assumptions.append(f"chip '{chip.name}' is emulated: the numbers are this machine's, not the chip's")
    return Profile(chip=chip.name, model=model.name, seq_len=training.seq_len,
                   micro_batch_size=training.micro_batch_size, layers=layers, update=update, source="measured",
                   device=device, assumptions=assumptions)
