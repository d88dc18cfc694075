"""Zorse's group on the HeteroPP runtime: replicas of different chip types taking uneven rows of each
micro-batch, ministages interleaved in GPipe order with an optimizer step per ministage, ZeRO-2 and
offload, each trained against the single-device reference trainer (fp32, same data, 20 steps)."""

from __future__ import annotations

import pytest
import torch

from h2.core.strategy import strategy_from_mapping
from h2.model import Transformer
from heteropp.topology import Topology
from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

STEPS = 20
TOLERANCE = 1e-5


def group(*, rows=(1, 3), ministages=2, sharding="zero2", offload=(), layers=4):
    """One stage: a chip-a replica and a chip-b replica of the tiny model, micro-batches of 4 sequences."""
    return {
        "dp": 2, "micro_batches": 2, "micro_batch_size": 2, "seq_len": 32,
        "ministages": ministages, "optimizer_sharding": sharding, "offload": list(offload), "model": {
            "preset": "tiny", "num_layers": layers
        }, "stages": [{"chips": ["chip-a", "chip-b"], "rows": list(rows), "tp": 1, "layers": layers}]
    }


def test_uneven_rows_give_each_replica_its_own_sequences_of_a_micro_batch():
    stage = Topology.from_strategy(strategy_from_mapping(group(), "s")).stages[0]
    assert [stage.rows(0), stage.rows(1)] == [range(0, 1), range(1, 4)]


@pytest.mark.slow
def test_a_mixed_type_group_with_rows_1_3_and_two_ministages_matches_the_reference():
    data = group()
    records, _ = run_pipeline(data, STEPS)
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE


@pytest.mark.slow
def test_without_clipping_each_ministage_steps_right_after_its_backward_and_matches_the_reference():
    data = group(ministages=4)
    records, _ = run_pipeline(data, STEPS, train={"grad_clip": 0.0})
    assert max_relative_loss_difference(records, run_reference(data, STEPS, train={"grad_clip": 0.0})) < TOLERANCE


@pytest.mark.slow
def test_zero2_keeps_about_one_dp_th_of_the_gradient_elements_zero1_keeps():
    zero1 = run_pipeline(group(rows=(2, 2), ministages=1, sharding="zero1"), 1)[1]
    zero2 = run_pipeline(group(rows=(2, 2), ministages=1, sharding="zero2"), 1)[1]
    whole = zero1[0]["reduced_gradient_elements"]
    assert [r["reduced_gradient_elements"] for r in zero1] == [whole, whole]
    assert sum(r["reduced_gradient_elements"] for r in zero2) == whole
    assert all(abs(r["reduced_gradient_elements"] - whole / 2) < 0.2 * whole for r in zero2)


@pytest.mark.slow
def test_offloading_activations_and_parameters_on_a_discrete_emulated_chip_matches_the_reference():
    data = group(offload=("activations", "parameters"))
    records, ranks = run_pipeline(data, STEPS, device="dipu", env={"DIPU_HOST_PROFILE": "discrete"})
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE
    assert [r["device_host_accessible"] for r in ranks] == [False, False]
    assert all(r["host_copies"] > 0 for r in ranks)  # activations went to host memory
    assert all(r["parameter_devices"] == ["cpu"] for r in ranks)  # parameters wait there between steps


@pytest.mark.slow
def test_h2_train_runs_the_local_zorse_group_on_its_emulated_mixed_cluster(tmp_path):
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([
        sys.executable, "-m", "h2.cli.main", "train", "--strategy", "configs/strategies/local-zorse-group.yaml",
        "--cluster", "configs/clusters/local-zorse.yaml", "--steps", "2", "--out",
        str(tmp_path / "run")
    ], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("emu-slow (emulated: 0.1x a host core, 250 MB) + emu-fast (emulated: 0.3x a host core, 250 MB)"
            in result.stdout)
    with open(tmp_path / "run" / "stage_report.json") as handle:
        assert [row["chip"] for row in json.load(handle)] == ["emu-slow+emu-fast"]


def test_h2_train_refuses_a_schedule_flag_other_than_gpipe_on_ministages_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(group()))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([
        sys.executable, "-m", "h2.cli.main", "train", "--strategy",
        str(path), "--steps", "1", "--schedule", "1f1b", "--out",
        str(tmp_path / "run")
    ], cwd=root, capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--schedule 1f1b does not apply to a strategy with ministages or offload" in result.stderr


@pytest.mark.slow
def test_offloading_parameters_then_activations_lowers_the_peak_device_memory_of_a_ministage_group():
    discrete = {"DIPU_HOST_PROFILE": "discrete"}
    peaks = []
    for offload in ((), ("parameters", ), ("parameters", "activations")):
        data = group(ministages=4, offload=offload)  # with prefetch two of the four stay resident
        data["schedule"] = "gpipe"
        _, ranks = run_pipeline(data, 1, device="dipu", env=discrete)
        peaks.append(ranks[0]["stage_report"][0]["peak_allocated_bytes"])
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.slow
def test_prefetching_the_next_ministage_on_a_side_thread_matches_the_reference():
    data = group(ministages=4, offload=("parameters", ))
    records, ranks = run_pipeline(data, 4, device="dipu", env={"DIPU_HOST_PROFILE": "discrete"})
    assert max_relative_loss_difference(records, run_reference(data, 4)) < TOLERANCE
    assert all(r["prefetches"] >= 3 * 4 for r in ranks)  # chunks 1-3 at least, every step
    assert all(r["parameter_devices"] == ["cpu"] for r in ranks)
    # clipping by the global norm, a chunk steps after the whole backward: every step chunks 0 and 1
    # leave the device unchanged in the forward, 3 and 2 in the backward (dropped, nothing to copy;
    # 1 stays for the next step's forward beside 0), and each is copied back after its step (and
    # once each at the start)
    assert all(r["parameter_moves_out"] == [4 + 4 * 4, 4 * 4] for r in ranks), [r["parameter_moves_out"] for r in ranks]


def clip_each_group(names: list[str], groups: list[list[str]]):
    """A stand-in for torch's clip_grad_norm_ in the reference trainer: the model's parameters (in
    the order of `names`) clipped group by group, each by its own gradients' norm."""
    clip = torch.nn.utils.clip_grad_norm_

    def clip_groups(parameters, max_norm):
        by_name = dict(zip(names, parameters))
        norms = [clip([by_name[name] for name in group], max_norm) for group in groups]
        return torch.linalg.vector_norm(torch.stack(norms))

    return clip_groups


@pytest.mark.slow
def test_clipping_each_ministage_by_its_own_norm_steps_it_at_once_and_matches_the_reference(monkeypatch):
    data = group(ministages=2)
    records, ranks = run_pipeline(data, 6, train={"grad_clip": 0.3, "grad_clip_scope": "ministage"})
    names = [name for name, _ in Transformer(strategy_from_mapping(data, "s").model_config()).named_parameters()]
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_each_group(names, ranks[0]["chunk_parameter_names"]))
    reference = run_reference(data, 6, train={"grad_clip": 0.3})
    assert max_relative_loss_difference(records, reference) < TOLERANCE
