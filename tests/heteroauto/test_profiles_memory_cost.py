import dataclasses
import os

import pytest

from autohelpers import CLUSTERS
from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.links import Link, links_from_mapping
from h2.core.model_config import preset
from h2.core.strategy import StageSpec, Strategy, strategy_from_mapping
from heteroauto.cost import iteration_time_s, pipeline_closed_form_s, pipeline_time_s, stage_busy_s
from heteroauto.evaluation import evaluate_strategy, strategy_terms
from heteroauto.memory import in_flight_micro_batches, stage_memory_bytes, stage_memory_terms
from heteroauto.profile_cache import ProfileTarget, cached_profile
from heteroauto.profiles import (
    load_profile,
    measured_profile,
    profile_fingerprint,
    profiles_for,
    save_profile,
    synthesise_profile,
    tp_collective_s,
)
from heteroauto.stage_terms import link_between_stages

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
    plain = stage_memory_terms(MODEL, training, layer, recompute=False, **args).max_layers(
        exp_c.chip("B").capacity_bytes, 96)
    recompute = stage_memory_terms(MODEL, training, layer, recompute=True, **args).max_layers(
        exp_c.chip("B").capacity_bytes, 96)
    assert recompute > plain


def test_cost_model_matches_the_paper_formula():
    compute, update, b = [3.0, 2.0, 1.0], [0.5, 0.0, 2.0], 4
    expected = max(b * compute[i] + update[i] + 1.0 * sum(compute[j] for j in range(3) if j != i) for i in range(3))
    assert iteration_time_s(compute, update, b, 1.0) == expected == 15.5
    assert iteration_time_s(compute, update, b, 0.0) == 12.5


def test_cost_model_with_alpha_one_and_no_update_is_the_pipeline_closed_form():
    compute = [1.5, 2.5, 0.5, 2.0]
    assert iteration_time_s(compute, [0.0] * 4, 7, 1.0) == pytest.approx(pipeline_closed_form_s(compute, 7))


def measurement(tp: int, **overrides) -> dict:
    """What heteropp.profiling.measure_tp returns for one TP size (as a dict)."""
    values = {
        "tp": tp, "forward_s": 0.010 / tp, "backward_s": 0.020 / tp, "recompute_s": 0.011 / tp,
        "activation_bytes": 3_000_000 // tp, "recompute_activation_bytes": 131_072, "workspace_bytes": 500_000,
        "update_s": 0.004 / tp, "embedding_forward_s": 0.0002, "embedding_backward_s": 0.0003, "head_forward_s": 0.003,
        "head_backward_s": 0.006, "device": "dipu:0", "late_fraction": 0.0
    }
    return {**values, **overrides}


@pytest.fixture(scope="module")
def hetero():
    return load_cluster(os.path.join(CLUSTERS, "local-hetero.yaml"))


def test_a_measured_profile_keeps_every_tp_size_as_measured_and_the_formula_beside_it(hetero):
    chip = hetero.chip("emu-fast")
    profile = measured_profile(hetero, chip, preset("small"), hetero.training,
                               [measurement(1), measurement(2, forward_s=0.009)], device="cpu", repeats=3)
    assert profile.layer(2).forward_s == 0.009 and profile.layer(2).workspace_bytes == 500_000
    formula = {entry.tp: entry for entry in profile.formula_layers}
    assert formula[2].forward_s == pytest.approx(0.010 / 2 +
                                                 2 * tp_collective_s(preset("small"), hetero.training, chip, 2))
    assert profile.fingerprint == profile_fingerprint(hetero, chip, preset("small"), hetero.training)


def test_a_profile_measured_for_another_chip_entry_is_refused(hetero, tmp_path):
    chip = hetero.chip("emu-fast")
    profile = measured_profile(hetero, chip, preset("small"), hetero.training, [measurement(1)], device="cpu",
                               repeats=1)
    path = tmp_path / "emu-fast.yaml"
    save_profile(profile, path)
    faster = dataclasses.replace(hetero, chips=(dataclasses.replace(chip, memory_gb=1.0), ) + hetero.chips[1:])
    with pytest.raises(UserError, match=r"emu-fast.yaml: field 'fingerprint': measured for another entry"):
        profiles_for(faster, preset("small"), hetero.training, [str(path)])


def test_an_emulated_chips_profile_measured_under_other_pacing_rules_is_stale(hetero, tmp_path, monkeypatch):
    """A cached profile of an emulated chip is measured again once the vendors pace kernels another way
    (h2.core.emulation.PACING_REVISION): its times were the old rule's."""
    model, chip = preset("small"), hetero.chip("emu-fast")
    target = ProfileTarget(chip, str(tmp_path / "emu-fast.yaml"))
    save_profile(measured_profile(hetero, chip, model, hetero.training, [measurement(1)], device="cpu", repeats=1),
                 target.path)
    assert cached_profile(target, hetero, model, hetero.training) is not None
    monkeypatch.setattr("h2.core.emulation.PACING_REVISION", "an earlier charge rule")
    assert cached_profile(target, hetero, model, hetero.training) is None
    with pytest.raises(UserError, match=r"emu-fast.yaml: field 'fingerprint': .* or emulator pacing than"):
        profiles_for(hetero, model, hetero.training, [target.path])


def test_measured_stage_ends_count_on_the_first_and_last_stage_only(hetero):
    model, training = preset("small"), hetero.training
    profiles = profiles_for(hetero, model, training)
    profiles["emu-fast"] = measured_profile(hetero, hetero.chip("emu-fast"), model, training, [measurement(1)],
                                            device="cpu", repeats=1)
    strategy = strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 8, "micro_batch_size": 1, "seq_len": 128, "model": "small", "stages": [{
                "chip": "emu-fast", "tp": 1, "layers": 1
            }, {"chip": "emu-fast", "tp": 1, "layers": 6}, {"chip": "emu-fast", "tp": 1, "layers": 1}]
        }, "s.yaml")
    report = evaluate_strategy(strategy, hetero, model, training, profiles)
    layer = profiles["emu-fast"].layer(1).compute_s(False)
    assert report.stages[0].compute_s == pytest.approx(layer + 0.0005)
    assert report.stages[1].compute_s == pytest.approx(6 * layer)
    assert report.stages[2].compute_s == pytest.approx(layer + 0.009)


def test_a_measured_backward_workspace_is_held_once_per_stage(hetero):
    model, training = preset("small"), hetero.training
    layer = measured_profile(hetero, hetero.chip("emu-fast"), model, training, [measurement(1)], device="cpu",
                             repeats=1).layer(1)
    args = dict(dp=1, recompute=False, position=1, num_stages=3, micro_batches=8)
    with_workspace = stage_memory_terms(model, training, layer, **args)
    without = stage_memory_terms(model, training, dataclasses.replace(layer, workspace_bytes=0), **args)
    assert with_workspace.fixed - without.fixed == 500_000 and with_workspace.per_layer == without.per_layer


# ---- the full cost model's terms ---------------------------------------------------------------------
TWO_STAGES = Strategy(dp=4, micro_batches=64, micro_batch_size=1, seq_len=4096, model="h2-100b",
                      stages=[StageSpec(chip="A", tp=8, layers=48),
                              StageSpec(chip="B", tp=4, layers=48)])


def terms_of(exp_c, cost_model, strategy=TWO_STAGES, cluster=None):
    cluster = cluster or exp_c
    return strategy_terms(strategy, cluster, MODEL, exp_c.training, profiles_for(cluster, MODEL, exp_c.training),
                          cost_model)


def test_paper_terms_hold_decoder_layers_only(exp_c):
    paper = terms_of(exp_c, "paper")
    layer = profiles_for(exp_c, MODEL, exp_c.training)["A"].layer(8)
    assert paper[0].compute_s == pytest.approx(48 * layer.compute_s(False))
    assert all(t.send_s == 0 for t in paper)


def test_full_terms_put_the_head_on_the_last_stage(exp_c):
    paper, full = terms_of(exp_c, "paper"), terms_of(exp_c, "full")
    layer = profiles_for(exp_c, MODEL, exp_c.training)["B"].layer(4)
    head_matmul = 3 * layer.forward_s * MODEL.head_forward_flops_per_token() / MODEL.layer_forward_flops_per_token(4096)
    added = full[1].compute_s - paper[1].compute_s
    assert head_matmul < added < head_matmul * 1.05  # the matmul at the layer's rate, plus the loss
    assert full[1].update_s > paper[1].update_s


def test_full_terms_put_the_embedding_on_the_first_stage(exp_c):
    paper, full = terms_of(exp_c, "paper"), terms_of(exp_c, "full")
    assert 0 < full[0].forward_s - paper[0].forward_s < 0.01 * paper[0].forward_s  # memory-bound lookup
    assert full[0].update_s > paper[0].update_s


def test_a_transfer_moves_one_micro_batch_over_the_smaller_side(exp_c):
    full = terms_of(exp_c, "full")
    lanes = min(8 * 4, 4 * 4)
    assert full[0].send_occupancy_s == pytest.approx(4 * 4096 * 8192 * 2 / lanes / 10e9)
    assert full[0].send_latency_s == pytest.approx(10e-6)
    assert full[1].send_s == 0


def test_link_classes_of_the_cluster_file_price_transfers_when_present(exp_c):
    section = links_from_mapping(
        {"inter_node": {"bandwidth_gbps": 100, "latency_us": 2}, "inter_type": {"bandwidth_gbps": 1, "latency_us": 50}},
        "c.yaml")
    with_links = dataclasses.replace(exp_c, links=section)
    assert link_between_stages(with_links, exp_c.chip("A"), exp_c.chip("B")) == Link(1, 50)
    assert link_between_stages(with_links, exp_c.chip("A"), exp_c.chip("A")) == Link(100, 2)
    assert terms_of(exp_c, "full", cluster=with_links)[0].send_latency_s == pytest.approx(50e-6)


def test_without_link_classes_the_chips_fields_price_transfers(exp_c):
    assert link_between_stages(exp_c, exp_c.chip("A"), exp_c.chip("B")) == Link(10, 10)


def test_the_cost_model_charges_each_boundary_twice_to_its_upstream_stage(exp_c):
    full = terms_of(exp_c, "full")
    busy = [t.compute_s + 2 * t.send_s for t in full]
    assert [stage_busy_s(t) for t in full] == busy
    expected = max(64 * c + t.update_s + (sum(busy) - c) for c, t in zip(busy, full))
    assert pipeline_time_s(full, 64, 1.0) == pytest.approx(expected)


def test_evaluation_scores_the_terms_it_reports(exp_c):
    report = evaluate_strategy(TWO_STAGES, exp_c, MODEL, exp_c.training, profiles_for(exp_c, MODEL, exp_c.training))
    assert report.iteration_s == pipeline_time_s(report.terms, 64, exp_c.training.alpha)
    assert report.cost_model == "full"
