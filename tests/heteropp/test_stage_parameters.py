"""A stage's parameters as the whole model knows them: names from the modules, cuts recorded by the TP
modules that made them (heteropp.stage_parameters), never guessed from a name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from h2.core.model_config import preset
from h2.model.transformer import Transformer
from heteropp.stage import apply_recompute, build_stage
from heteropp.stage_parameters import load_full, shard_of, stage_parameters, whole_of
from heteropp.tensor_parallel import ShardLinear, apply_tp

GROUP = object()  # stands for a TP group: building a stage only stores it (no forward runs here)


def model(name: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(preset(name))


def tp_stage(name: str, layers: range, tp_index: int, *, first: bool, last: bool) -> nn.Module:
    stage = build_stage(model(name), layers, first=first, last=last)
    return apply_recompute(apply_tp(stage, tp_index=tp_index, tp_size=2, group=GROUP, store=None))


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("layers, first, last", [(range(0, 2), True, False), (range(2, 4), False, True)])
def test_the_shards_of_a_tp2_stage_gathered_by_their_recorded_dims_are_the_single_device_weights(
        name, layers, first, last):
    shards = [stage_parameters(tp_stage(name, layers, index, first=first, last=last), layers) for index in (0, 1)]
    whole = dict(model(name).named_parameters())
    assert [piece.name for piece in shards[0]] == [piece.name for piece in shards[1]]
    expected = [
        n for n in whole if n.startswith(tuple(
            f"layers.{i}."
            for i in layers)) or (first and n.startswith("embed")) or (last and n.startswith(("norm", "head")))
    ]
    assert sorted(piece.name for piece in shards[0]) == sorted(expected)
    for zero, one in zip(*shards):
        assert zero.split_dim == one.split_dim
        assert torch.equal(whole_of([zero.param, one.param], zero.split_dim), whole[zero.name]), zero.name


def test_a_tp2_stage_records_the_cut_of_each_kind_of_weight():
    pieces = stage_parameters(tp_stage("tiny", range(2, 4), 0, first=False, last=True), range(2, 4))
    dims = {name: dim for name, _, dim in pieces}
    names = ("layers.2.attn.q_proj.weight", "layers.2.attn.o_proj.weight", "layers.3.mlp.down_proj.weight",
             "head.weight", "norm.weight", "layers.3.attn_norm.weight")
    assert [dims[name] for name in names] == [0, 1, 1, 0, None, None]


def test_a_stage_of_one_tp_rank_holds_every_weight_whole():
    stage = apply_tp(build_stage(model("tiny"), range(0, 4), first=True, last=True), tp_index=0, tp_size=1, group=None,
                     store=None)
    assert {dim for _, _, dim in stage_parameters(stage, range(0, 4))} == {None}


def odd_stage(weight: torch.Tensor, tp_index: int) -> nn.Module:
    """A stage whose layer holds a shard named like a row-parallel weight but cut along its rows."""
    stage = nn.Module()
    stage.layers = nn.ModuleList([nn.Module()])
    stage.layers[0].o_proj = ShardLinear(shard_of(weight, 0, tp_index, 2), None, tp_split_dim=0)
    return stage


def test_a_shard_is_gathered_along_the_dim_it_was_cut_whatever_its_name_suggests():
    weight = torch.arange(48.0).reshape(8, 6)
    shards = [stage_parameters(odd_stage(weight, index), range(5, 6)) for index in (0, 1)]
    assert [piece.name for piece in shards[0]] == ["layers.5.o_proj.weight"]
    assert torch.equal(whole_of([shards[0][0].param, shards[1][0].param], shards[0][0].split_dim), weight)


def test_loading_whole_weights_gives_each_tp_rank_the_slice_apply_tp_gave_it():
    whole = {name: param.detach() for name, param in model("tiny").named_parameters()}
    for index in (0, 1):
        expected = stage_parameters(tp_stage("tiny", range(0, 4), index, first=True, last=True), range(0, 4))
        loaded = stage_parameters(tp_stage("tiny", range(0, 4), index, first=True, last=True), range(0, 4))
        with torch.no_grad():
            for _, param, _ in loaded:
                param.zero_()
        load_full(loaded, index, 2, whole)
        assert all(torch.equal(ours.param, theirs.param) for ours, theirs in zip(loaded, expected))
