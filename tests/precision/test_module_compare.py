"""Module-level compare: the first module whose outputs or gradients diverge is named."""

from __future__ import annotations

import torch

from conftest import Perturb, build_tiny, tiny_batch
from ditorch.precision.module_compare import compare_module_step


def lm_loss(logits, targets):
    from h2.model.transformer import language_model_loss
    return language_model_loss(logits, targets)


def compare(candidate_context=None):
    model, tokens = build_tiny(), tiny_batch()
    return compare_module_step(model, (tokens[:, :-1], ), targets=tokens[:, 1:], loss_fn=lm_loss,
                               candidate_device="cpu", candidate_context=candidate_context)


def test_same_device_same_weights_shows_no_divergence():
    report = compare()
    assert report.first_divergence is None
    assert report.reference_loss == report.candidate_loss
    paths = [d.module for d in report.forward]
    assert paths[0] == "Transformer.embed" and paths[-1] == "Transformer"
    assert "Transformer.layers.3.mlp.down_proj" in paths
    assert len(report.parameters) == len(list(build_tiny().parameters()))


def test_first_diverging_module_is_the_one_whose_op_changed():
    target = "Transformer.layers.1.mlp.up_proj"
    report = compare(lambda: Perturb("mm", predicate=lambda call: call.module == target and call.phase == "forward"))
    first = report.first_divergence
    assert (first.module, first.kind) == (target, "output")
    assert first.comparison.max_rel > 5e-4
    earlier = report.forward[:[d.module for d in report.forward].index(target)]
    assert all(d.passed for d in earlier)
    assert f"first divergence: {target} output" in report.format()


def test_backward_only_change_is_found_in_gradients():
    target = "Transformer.layers.2.attn.v_proj"
    report = compare(
        lambda: Perturb("mm", relative=1e-2, predicate=lambda call: call.module == target and call.phase == "backward"))
    assert all(d.passed for d in report.forward)
    first = report.first_divergence
    assert first.kind == "output grad" or first.kind == "param grad"
    assert any(d.module == f"{target}.weight" and not d.passed for d in report.parameters)


def test_model_passed_in_is_left_untouched():
    model, tokens = build_tiny(), tiny_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compare_module_step(model, (tokens[:, :-1], ), candidate_device="cpu")
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
