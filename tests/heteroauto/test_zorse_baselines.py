"""The Zorse paper's baselines (heteroauto/zorse/baselines.py) keep their rules, and chip files carry
their provenance (spec sheet or measured)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from heteroauto.profiles import profiles_for
from heteroauto.zorse.baselines import BaselinePlan, OutOfMemory, cephalo, hexiscale, torchtitan_het
from heteroauto.zorse.planner import rates_from_profiles


@functools.cache
def setting(name: str, size: str):
    cluster = load_cluster(f"configs/clusters/zorse-{name}.yaml")
    training = dataclasses.replace(cluster.training, micro_batch_size=1)
    model = resolve_model(f"configs/models/llama-{size}.yaml")
    return cluster, model, training, rates_from_profiles(cluster, profiles_for(cluster, model, training, []))


def test_torchtitan_het_has_uniform_stages_even_rows_and_gathers_per_micro_batch():
    found = torchtitan_het(*setting("a", "7b"))
    assert isinstance(found, BaselinePlan)
    sizes = {len(group.chips) for group in found.plan.groups}
    assert len(sizes) == 1 and len(found.plan.groups) > 1
    assert all(len(set(group.rows)) == 1 for group in found.plan.groups)
    assert found.plan.ministages == 1 and not found.plan.offload and found.schedule == "1f1b"
    assert found.collectives_per_micro_batch
    assert sum(group.layers for group in found.plan.groups) == 32
    assert found.plan.max_memory_fraction <= 1


def test_hexiscale_pipelines_zero2_stages_without_ministages_or_offload():
    cluster, model, training, rates = setting("a", "7b")
    found = hexiscale(cluster, model, training, rates)
    assert isinstance(found, BaselinePlan)
    assert found.plan.ministages == 1 and not found.plan.offload and found.schedule == "1f1b"
    assert not found.collectives_per_micro_batch
    assert sum(len(group.chips) for group in found.plan.groups) == 20
    assert found.plan.max_memory_fraction <= 1
    # layers follow speed: an H100 stage of 2 GPUs holds more layers per GPU than an A100 stage
    per_gpu = {group.chips[0]: group.layers / len(group.chips) for group in found.plan.groups}
    assert per_gpu["h100-nvl"] > per_gpu["a100-80g"]


def test_cephalo_is_one_zero3_group_of_every_gpu_without_a_pipeline():
    found = cephalo(*setting("a", "7b"))
    assert isinstance(found, BaselinePlan)
    assert len(found.plan.groups) == 1 and len(found.plan.groups[0].chips) == 20
    assert found.plan.ministages == 32  # every layer gathered and resharded on its own (ZeRO-3)
    rows = dict(zip(found.plan.groups[0].chips, found.plan.groups[0].rows))
    assert rows["h100-nvl"] > rows["a100-80g"]  # uneven batch sizes by speed


def test_torchtitan_het_runs_out_of_memory_on_cluster_a_65b_as_in_the_paper():
    found = torchtitan_het(*setting("a", "65b"))
    assert isinstance(found, OutOfMemory)
    assert "needs" in found.reason and "GB" in found.reason and found.describe().startswith("OOM: ")


def test_chip_provenance_is_loaded_kept_and_checked(tmp_path):
    cluster = load_cluster("configs/clusters/zorse-a.yaml")
    assert all(chip.provenance.startswith("spec sheet: ") for chip in cluster.chips)
    (tmp_path / "c.yaml").write_text("name: c\nchips:\n  - {name: x, count: 1, memory_gb: 1, chips_per_node: 1, "
                                     "tp_max: 1, intra_node_gbps: 1, inter_node_gbps: 1, provenance: guessed}\n")
    with pytest.raises(UserError, match="field 'provenance' must start with 'spec sheet: ' or 'measured: '"):
        load_cluster(tmp_path / "c.yaml")


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_measured_cluster_files_parse_with_measured_chips(name):
    spec = load_cluster(f"configs/clusters/zorse-{name}.yaml")
    measured = load_cluster(f"configs/clusters/zorse-{name}-measured.yaml")
    assert [chip.name for chip in measured.chips] == [chip.name for chip in spec.chips]
    assert all(chip.provenance.startswith("measured: ") for chip in measured.chips)
    assert measured.training == spec.training


def test_measured_h100_is_about_one_and_a_half_a100_where_the_spec_sheet_says_three():

    def rate(cluster, chip):
        chip = cluster.chip(chip)
        return chip.peak_tflops * chip.achievable_fraction

    spec = load_cluster("configs/clusters/zorse-a.yaml")
    measured = load_cluster("configs/clusters/zorse-a-measured.yaml")
    assert rate(spec, "h100-nvl") / rate(spec, "a100-80g") == pytest.approx(3.17, abs=0.01)
    assert rate(measured, "h100-nvl") / rate(measured, "a100-80g") == pytest.approx(1.56, abs=0.01)
