import os

import pytest

from h2.core.errors import UserError
from h2.core.model_config import preset
from heteropp.auto.cost import iteration_time_s, pipeline_closed_form_s
from heteropp.auto.memory import in_flight_micro_batches, stage_memory_bytes, stage_memory_terms
from heteropp.auto.profiles import load_profile, profiles_for, save_profile, synthesise_profile
from h2.core.cluster import load_cluster

from autohelpers import CLUSTERS

MODEL = preset("h2-100b")


@pytest.fixture(scope="module")
def exp_c():
    return load_cluster(os.path.join(CLUSTERS, "exp-c-1.yaml"))


def test_synthesised_forward_time_is_flops_over_achievable_rate(exp_c):
    chip, training = exp_c.chip("A"), exp_c.training
    profile = synthesise_profile(chip, MODEL, training)
    flops = MODEL.layer_forward_flops_per_token(4096) * 4096
    assert profile.layer(1).forward_s == pytest.approx(flops / (234e12 * 0.45))
    assert profile.layer(1).backward_s == pytest.approx(2 * profile.layer(1).forward_s)
    assert profile.assumptions  # the file says what it assumed


def test_larger_tp_shards_compute_but_pays_collectives(exp_c):
    profile = synthesise_profile(exp_c.chip("B"), MODEL, exp_c.training)
    t1, t8 = profile.layer(1), profile.layer(8)
    assert t8.forward_s < t1.forward_s / 4
    assert t8.forward_s > t1.forward_s / 8
    assert t8.activation_bytes < t1.activation_bytes
    assert t8.recompute_activation_bytes == t1.recompute_activation_bytes


def test_update_time_shrinks_with_zero1_sharding_but_sync_grows(exp_c):
    profile = synthesise_profile(exp_c.chip("A"), MODEL, exp_c.training)
    assert profile.update_s(1, 4) < profile.update_s(2, 4)  # dp=1 has no gradient sync at all
    assert profile.update_s(3, 1) is not None and profile.update_s(5, 1) is None  # 384 = 128 * 3


def test_profile_round_trips_through_yaml(exp_c, tmp_path):
    profile = synthesise_profile(exp_c.chip("A"), MODEL, exp_c.training)
    save_profile(profile, tmp_path / "a.yaml")
    assert load_profile(tmp_path / "a.yaml").to_dict() == profile.to_dict()


def test_profile_of_an_unknown_chip_type_is_refused(exp_c, tmp_path):
    profile = synthesise_profile(exp_c.chip("A"), MODEL, exp_c.training)
    path = tmp_path / "z.yaml"
    save_profile(profile, path)
    path.write_text(path.read_text().replace("chip: A", "chip: Z"))
    with pytest.raises(UserError, match=r"z.yaml: field 'chip': unknown chip type 'Z'"):
        profiles_for(exp_c, MODEL, exp_c.training, [str(path)])


def test_earlier_stages_hold_more_micro_batches():  # Observation 4
    assert [in_flight_micro_batches(p, 4, 8) for p in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches(0, 4, 2) == 2


def test_stage_memory_by_hand(exp_c):
    training = exp_c.training
    layer = synthesise_profile(exp_c.chip("A"), MODEL, training).layer(4)
    middle = stage_memory_bytes(MODEL, training, layer, dp=4, recompute=False, position=2, num_stages=16,
                                micro_batches=128, layers=6)
    shard = (MODEL.layer_params() - 2 * 8192) / 4 + 2 * 8192
    expected = 6 * (shard * (2 + 4 + 12 / 4) + 14 * layer.activation_bytes)
    assert middle == pytest.approx(expected)


def test_first_and_last_stages_carry_embedding_and_head(exp_c):
    training = exp_c.training
    layer = synthesise_profile(exp_c.chip("A"), MODEL, training).layer(4)
    args = dict(dp=4, recompute=True, num_stages=16, micro_batches=128)
    first = stage_memory_terms(MODEL, training, layer, position=0, **args)
    second = stage_memory_terms(MODEL, training, layer, position=1, **args)
    last = stage_memory_terms(MODEL, training, layer, position=15, **args)
    assert first.fixed - second.fixed == pytest.approx(MODEL.embedding_params() / 4 * (2 + 4 + 3))
    assert last.fixed > second.fixed and first.per_layer > second.per_layer > last.per_layer


def test_recompute_lets_more_layers_fit(exp_c):
    training = exp_c.training
    layer = synthesise_profile(exp_c.chip("B"), MODEL, training).layer(4)
    args = dict(dp=4, position=0, num_stages=16, micro_batches=128)
    plain = stage_memory_terms(MODEL, training, layer, recompute=False, **args).max_layers(exp_c.chip("B").capacity_bytes, 96)
    recompute = stage_memory_terms(MODEL, training, layer, recompute=True, **args).max_layers(exp_c.chip("B").capacity_bytes, 96)
    assert recompute > plain


def test_cost_model_matches_the_paper_formula():
    compute, update, b = [3.0, 2.0, 1.0], [0.5, 0.0, 2.0], 4
    expected = max(b * compute[i] + update[i] + 1.0 * sum(compute[j] for j in range(3) if j != i) for i in range(3))
    assert iteration_time_s(compute, update, b, 1.0) == expected == 15.5
    assert iteration_time_s(compute, update, b, 0.0) == 12.5


def test_cost_model_with_alpha_one_and_no_update_is_the_pipeline_closed_form():
    compute = [1.5, 2.5, 0.5, 2.0]
    assert iteration_time_s(compute, [0.0] * 4, 7, 1.0) == pytest.approx(pipeline_closed_form_s(compute, 7))
