"""Op selection: exact names in any spelling, regular expressions, a predicate, an exclude list."""

from __future__ import annotations

import pytest
import torch

from ditorch.op_tools.observe import OpObserve
from ditorch.op_tools.op_filter import OpFilter, qualified_name

aten = torch.ops.aten


def test_qualified_name_has_namespace_op_and_overload():
    assert qualified_name(aten.mm.default) == "aten.mm.default"
    assert qualified_name(aten.add.Tensor) == "aten.add.Tensor"


@pytest.mark.parametrize("spelling", ["mm", "mm.default", "aten.mm", "aten::mm", "aten.mm.default"])
def test_exact_name_matches_in_every_spelling(spelling):
    chosen = OpFilter(spelling)
    assert chosen.matches_op(aten.mm.default)
    assert not chosen.matches_op(aten.addmm.default)


def test_no_names_select_every_op_but_the_excluded():
    chosen = OpFilter(exclude="add,mul.Tensor")
    assert chosen.matches_op(aten.mm.default)
    assert not chosen.matches_op(aten.add.Tensor) and not chosen.matches_op(aten.mul.Tensor)
    assert chosen.matches_op(aten.mul.Scalar)


def test_pattern_is_searched_in_the_qualified_name():
    chosen = OpFilter(patterns=r"\.(b|addb)?mm\.")
    assert chosen.matches_op(aten.mm.default) and chosen.matches_op(aten.bmm.default)
    assert not chosen.matches_op(aten.addmm.default)


def test_names_and_patterns_select_their_union_and_exclude_wins():
    chosen = OpFilter(["add"], patterns="softmax", exclude=["_softmax"])
    assert chosen.matches_op(aten.add.Tensor) and chosen.matches_op(aten._log_softmax.default)
    assert not chosen.matches_op(aten._softmax.default) and not chosen.matches_op(aten.mm.default)


def test_bad_pattern_is_a_clear_error():
    with pytest.raises(ValueError, match="bad regular expression"):
        OpFilter(patterns="mm(")


def test_predicate_sees_module_path_and_phase():
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4, requires_grad=True)
    with OpObserve(predicate=lambda call: call.module == "Sequential.2" and call.phase == "backward",
                   report=None) as observe:
        layer(x).sum().backward()
    assert observe.records, "the predicate selected nothing"
    assert {r["module"] for r in observe.records} == {"Sequential.2"}
    assert {r["phase"] for r in observe.records} == {"backward"}
    assert "aten.mm.default" in {r["op"] for r in observe.records}
