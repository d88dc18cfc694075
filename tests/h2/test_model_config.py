import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from h2.core.errors import UserError
from h2.model import DecoderLayer, Transformer, load_model_config, preset, resolve_model


def hand_count_100b() -> int:
    h, layers, kv_heads, head_dim, inter, vocab = 8192, 96, 8, 128, 36864, 92544
    attention = 2 * h * h + 2 * h * kv_heads * head_dim
    mlp = 3 * h * inter
    norms = 2 * h
    return layers * (attention + mlp + norms) + 2 * vocab * h + h


def test_100b_parameter_count_is_within_one_percent_of_a_hand_count():
    count = preset("h2-100b").num_parameters()
    assert abs(count - hand_count_100b()) / hand_count_100b() < 0.01
    assert 102e9 < count < 104e9


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("tied", [False, True])
def test_parameter_accounting_matches_the_built_module(name, tied):
    config = dataclasses.replace(preset(name), tie_embeddings=tied)
    model = Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()
    assert sum(p.numel() for p in model.layers[0].parameters()) == config.layer_params()


def test_layer_matmul_flops_match_torch_flop_counter():
    config = preset("tiny")
    layer = DecoderLayer(config)
    x = torch.randn(2, config.max_seq_len, config.hidden_size, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        y = layer(x)
    with FlopCounterMode(display=False) as backward:
        y.sum().backward()
    tokens = 2 * config.max_seq_len
    matmul_forward = 2 * (config.attention_params() + config.mlp_params())
    assert forward.get_total_flops() == matmul_forward * tokens
    assert backward.get_total_flops() == 2 * matmul_forward * tokens


def test_attention_score_flops_are_the_full_square_of_qk_and_pv():
    config = preset("tiny")
    s, d, heads = config.max_seq_len, config.head_dim, config.num_heads
    q, k, v = (torch.randn(1, heads, s, d) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        (q @ k.transpose(-1, -2)).softmax(-1) @ v
    attention_per_token = config.layer_forward_flops_per_token() - 2 * (config.attention_params() + config.mlp_params())
    assert counter.get_total_flops() == attention_per_token * s


def test_recompute_keeps_only_the_layer_input():
    config = preset("h2-100b")
    assert config.layer_recompute_activation_bytes(1) == 2 * 4096 * 8192
    assert config.layer_activation_bytes(1, tp=8) < config.layer_activation_bytes(1)
    assert config.layer_activation_bytes(2) == 2 * config.layer_activation_bytes(1)


def test_yaml_preset_with_overrides(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("preset: tiny\nnum_layers: 6\n")
    config = load_model_config(path)
    assert config.num_layers == 6 and config.hidden_size == preset("tiny").hidden_size
    assert resolve_model(str(path)) == config


@pytest.mark.parametrize("text, message", [
    ("num_layers: [1\n", "malformed YAML"),
    ("preset: tiny\nnum_layers: four\n", "field 'num_layers': expected an integer"),
    ("preset: tiny\nnum_layer: 4\n", "unknown field 'num_layer'"),
    ("preset: huge\n", "unknown preset 'huge'"),
    ("preset: tiny\nnum_heads: 3\n", "field 'hidden_size' (64) must be divisible by num_heads (3)"),
    ("preset: tiny\nnum_layers: 0\n", "field 'num_layers' must be positive"),
    ("- 1\n- 2\n", "top level must be a mapping"),
])
def test_bad_model_yaml_names_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as error:
        load_model_config(path)
    assert str(path) in str(error.value) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UserError, match="unknown model preset 'gpt5'.*tiny, small, h2-100b"):
        preset("gpt5")
