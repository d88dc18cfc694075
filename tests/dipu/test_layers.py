"""Network layers on dipu against the same layers on the CPU: convolutions, normalization and
transformer layers give the CPU's bits (the host vendor runs the CPU's kernels); recurrent layers,
which a PrivateUse1 device runs through fused cells the CPU lacks, agree to float rounding."""
import copy

import pytest
import torch
import torch.nn as nn

import ditorch.dipu as dipu


def forward_and_gradients(module: nn.Module, inputs: torch.Tensor, device: str):
    """The output and every parameter's and the input's gradient of one forward and backward on device."""
    module = copy.deepcopy(module).to(device)
    x = inputs.detach().to(device).requires_grad_(True)
    output = module(x)
    output = output[0] if isinstance(output, tuple) else output
    cotangent = torch.linspace(-1, 1, output.numel()).reshape(output.shape).to(device)
    (output * cotangent).sum().backward()
    gradients = [x.grad] + [p.grad for p in module.parameters()]
    return [output.detach().cpu()] + [g.cpu() for g in gradients]


def assert_same_bits(module: nn.Module, inputs: torch.Tensor):
    for on_dipu, on_cpu in zip(forward_and_gradients(module, inputs, "dipu"),
                               forward_and_gradients(module, inputs, "cpu")):
        assert torch.equal(on_dipu, on_cpu)


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv1d(3, 4, 3, padding=1), (2, 3, 9)),
    (nn.Conv2d(4, 8, 3, stride=2, groups=2), (2, 4, 9, 9)),
    (nn.Conv3d(2, 3, 2), (1, 2, 4, 5, 5)),
    (nn.ConvTranspose2d(3, 2, 3, stride=2, output_padding=1), (2, 3, 5, 5)),
], ids=["conv1d", "conv2d-grouped-strided", "conv3d", "conv-transpose2d"])
def test_convolutions_give_the_cpus_output_and_gradients(layer, shape):
    torch.manual_seed(0)
    assert_same_bits(layer, torch.randn(shape))


def test_a_conv_net_with_batch_norm_and_pooling_gives_the_cpus_bits_in_training_and_in_eval():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                        nn.AdaptiveAvgPool2d(3), nn.Flatten(), nn.Linear(36, 5))
    images = torch.randn(3, 1, 10, 10)
    assert_same_bits(net, images)
    assert_same_bits(net.eval(), images)


@pytest.mark.parametrize("layer", [
    nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True),
    nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", norm_first=True, batch_first=True),
    nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True),
], ids=["encoder-post-norm-relu", "encoder-pre-norm-gelu", "decoder"])
def test_transformer_layers_give_the_cpus_bits(layer):
    torch.manual_seed(0)
    if isinstance(layer, nn.TransformerDecoderLayer):
        memory = torch.randn(2, 5, 16)
        layer = DecoderOverMemory(layer, memory)
    assert_same_bits(layer, torch.randn(2, 5, 16))


class DecoderOverMemory(nn.Module):

    def __init__(self, layer, memory):
        super().__init__()
        self.layer = layer
        self.register_buffer("memory", memory)

    def forward(self, target):
        return self.layer(target, self.memory)


class SelfAttention(nn.Module):

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x)[0]


@pytest.mark.parametrize(
    "layer, shape", [
        (nn.GroupNorm(2, 4), (2, 4, 5, 5)),
        (nn.LayerNorm(8), (3, 8)),
        (nn.InstanceNorm2d(4, affine=True), (2, 4, 5, 5)),
        (nn.BatchNorm1d(4), (6, 4)),
        (SelfAttention(), (2, 5, 16)),
        (nn.GELU("tanh"), (20, )),
    ], ids=["group-norm", "layer-norm", "instance-norm", "batch-norm-1d", "multihead-attention", "gelu-tanh"])
def test_normalization_and_attention_modules_give_the_cpus_bits(layer, shape):
    torch.manual_seed(0)
    assert_same_bits(layer, torch.randn(shape))


@pytest.mark.parametrize("layer, shape", [
    (nn.LSTM(5, 6, num_layers=2, batch_first=True), (3, 4, 5)),
    (nn.LSTM(5, 6, bidirectional=True, bias=False), (4, 3, 5)),
    (nn.GRU(5, 6, num_layers=2), (4, 3, 5)),
    (nn.LSTMCell(5, 6), (3, 5)),
    (nn.GRUCell(5, 6), (3, 5)),
], ids=["lstm-2-layers", "lstm-bidirectional-no-bias", "gru-2-layers", "lstm-cell", "gru-cell"])
def test_recurrent_layers_agree_with_the_cpu_to_float_rounding(layer, shape):
    torch.manual_seed(0)
    inputs = torch.randn(shape)
    for on_dipu, on_cpu in zip(forward_and_gradients(layer, inputs, "dipu"), forward_and_gradients(
            layer, inputs, "cpu")):
        torch.testing.assert_close(on_dipu, on_cpu, rtol=1e-5, atol=1e-6)


def test_recurrent_cells_run_their_gates_through_diopi():
    dipu.reset_fallback_counts()
    before = dipu._C._diopi_call_counts()
    forward_and_gradients(nn.LSTM(3, 4), torch.randn(2, 1, 3), "dipu")
    forward_and_gradients(nn.GRU(3, 4), torch.randn(2, 1, 3), "dipu")
    after = dipu._C._diopi_call_counts()
    ran = {op for op in after if after[op] > before.get(op, 0)}
    assert {
        "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl", "aten::_thnn_fused_gru_cell",
        "aten::_thnn_fused_gru_cell_backward"
    } <= ran
    assert dipu.fallback_counts() == {}


def test_in_place_relu_runs_on_the_device():
    x = torch.randn(5, 6)
    on_dipu = x.to("dipu")
    calls = dipu._C._diopi_call_counts().get("aten::relu_", 0)
    on_dipu.relu_()
    assert torch.equal(on_dipu.cpu(), x.relu())
    assert dipu._C._diopi_call_counts()["aten::relu_"] == calls + 1
