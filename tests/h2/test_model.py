import dataclasses

import torch

from h2.model import Transformer, preset


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Transformer(dataclasses.replace(preset("tiny"), **overrides))


def test_logits_have_vocabulary_shape():
    model = tiny_model()
    tokens = torch.randint(0, 256, (3, 17))
    assert model(tokens).shape == (3, 17, 256)


def test_attention_is_causal():
    model = tiny_model()
    tokens = torch.randint(0, 256, (1, 32))
    changed = tokens.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % 256
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :20], after[:, :20], rtol=0, atol=0)
    assert not torch.allclose(before[:, 20:], after[:, 20:])


def test_any_split_of_layers_composes_to_the_whole_model():
    model = tiny_model()
    tokens = torch.randint(0, 256, (2, 16))
    x = model.embed(tokens)
    for stage in (model.layers[:1], model.layers[1:3], model.layers[3:]):
        for layer in stage:
            x = layer(x)
    torch.testing.assert_close(model.head(model.norm(x)), model(tokens), rtol=0, atol=0)


def test_tied_embeddings_share_one_tensor():
    model = tiny_model(tie_embeddings=True)
    assert model.head.weight is model.embed.weight


def test_grouped_query_attention_uses_fewer_key_value_heads():
    model = tiny_model()
    attention = model.layers[0].attn
    config = preset("tiny")
    assert attention.k_proj.out_features == config.num_kv_heads * config.head_dim
    assert attention.q_proj.out_features == config.num_heads * config.head_dim


def test_same_seed_builds_the_same_weights():
    a, b = tiny_model(seed=3), tiny_model(seed=3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
