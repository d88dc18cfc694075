"""Zorse's ministages over a pipeline of several stages (groups): the last stage's chunk c feeds stage
0's chunk c + 1 (the wrap-around) and its gradient comes back, through the same resharder and p2p
path as every stage boundary; trained against the single-device reference trainer (fp32, same data)."""

from __future__ import annotations

import pytest

from h2.core.schedule import gpipe_ministages
from heteroauto.simulator import simulate
from heteroauto.stage_terms import StageTerms
from heteropp_launch import max_relative_loss_difference, run_pipeline, run_reference

STEPS = 20
TOLERANCE = 1e-5
SEQ_LEN, HIDDEN = 32, 64  # the tiny preset's hidden size


def two_groups(*, ministages=2, sharding="zero2", offload=()):
    """Stage 0: a mixed group (chip-a and chip-b replicas, rows 1:3); stage 1: one chip-b replica taking
    whole micro-batches of 4 sequences. The tiny model's 4 layers: 1 per chunk with 2 ministages."""
    return {
        "dp": 2, "micro_batches": 2, "micro_batch_size": 2, "seq_len": SEQ_LEN,
        "ministages": ministages, "optimizer_sharding": sharding, "offload": list(offload), "model": {
            "preset": "tiny", "num_layers": 4
        }, "stages": [{"chips": ["chip-a", "chip-b"], "rows": [1, 3], "tp": 1, "layers": 2},
                      {"chip": "chip-b", "dp": 1, "tp": 1, "layers": 2}]
    }


@pytest.mark.slow
def test_two_mixed_groups_with_two_ministages_and_zero2_match_the_reference():
    data = two_groups()
    records, _ = run_pipeline(data, STEPS)
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE


@pytest.mark.slow
def test_two_groups_stepping_each_ministage_right_after_its_backward_match_the_reference():
    data = two_groups(sharding="zero1")
    records, _ = run_pipeline(data, STEPS, train={"grad_clip": 0.0})
    assert max_relative_loss_difference(records, run_reference(data, STEPS, train={"grad_clip": 0.0})) < TOLERANCE


@pytest.mark.slow
def test_two_groups_offloading_activations_and_parameters_on_discrete_chips_match_the_reference():
    data = two_groups(offload=("activations", "parameters"))
    records, ranks = run_pipeline(data, STEPS, device="dipu", env={"DIPU_HOST_PROFILE": "discrete"})
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE
    assert all(r["host_copies"] > 0 and r["parameter_devices"] == ["cpu"] for r in ranks)


@pytest.mark.slow
def test_the_last_stage_sends_its_first_chunks_activations_around_to_stage_0():
    """Per step the last stage sends (ministages - 1) * micro_batches activations forward (the wrap
    to stage 0) and ministages * micro_batches gradients backward, each a whole micro-batch of
    4 sequences; without the wrap-around it would send only the gradients."""
    data = two_groups()
    _, ranks = run_pipeline(data, 1)
    (last, ) = [r for r in ranks if r["stage"] == 1]
    micro_batch_bytes = 4 * SEQ_LEN * HIDDEN * 4
    wrapped, gradients = (2 - 1) * 2, 2 * 2
    assert last["bytes_sent"] == (wrapped + gradients) * micro_batch_bytes


def test_the_simulator_prices_the_wrap_around_on_the_last_stages_link():
    """Ministage 1 (the last stage's chunk 0) is the only one whose send takes time: micro-batch 0
    crosses its link at least twice on the critical path (forward to stage 0's chunk 1, and its
    gradient back)."""
    schedule = gpipe_ministages(2, 2, 2)
    free = [StageTerms(forward_s=1.0, backward_s=2.0, weight_grad_s=0.0, update_s=0.0)] * 4
    wrap = list(free)
    wrap[1] = StageTerms(forward_s=1.0, backward_s=2.0, weight_grad_s=0.0, update_s=0.0, send_occupancy_s=10.0,
                         send_latency_s=0.0)
    assert simulate(schedule, wrap).iteration_s >= simulate(schedule, free).iteration_s + 2 * 10.0


@pytest.mark.slow
def test_three_stages_with_two_ministages_wrap_over_their_own_group_and_match_the_reference():
    data = {
        "dp": 1, "micro_batches": 2, "micro_batch_size": 2, "seq_len": SEQ_LEN, "ministages": 2, "model": {
            "preset": "tiny", "num_layers": 6
        }, "stages": [{"chip": "chip-a", "tp": 1, "layers": 2}, {"chip": "chip-b", "tp": 1, "layers": 2},
                      {"chip": "chip-a", "tp": 1, "layers": 2}]
    }
    records, _ = run_pipeline(data, STEPS)
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE


@pytest.mark.slow
def test_a_tp_2_stage_before_a_mixed_group_runs_ministages_and_matches_the_reference():
    data = two_groups()
    data["stages"] = [{"chip": "chip-a", "tp": 2, "dp": 1, "layers": 2}, {**data["stages"][0]}]
    records, _ = run_pipeline(data, STEPS)
    assert max_relative_loss_difference(records, run_reference(data, STEPS)) < TOLERANCE


@pytest.mark.slow
def test_h2_train_runs_two_emulated_chips_as_two_stages_of_two_ministages_on_the_local_zorse_cluster(tmp_path):
    import os
    import subprocess
    import sys

    import yaml
    strategy = {
        "dp": 1, "micro_batches": 2, "micro_batch_size": 2, "seq_len": 32, "ministages": 2, "model": "small",
        "stages": [{"chip": "emu-slow", "tp": 1, "layers": 4}, {"chip": "emu-fast", "tp": 1, "layers": 4}]
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(strategy))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([
        sys.executable, "-m", "h2.cli.main", "train", "--strategy",
        str(path), "--cluster", "configs/clusters/local-zorse.yaml", "--steps", "2", "--out",
        str(tmp_path / "run")
    ], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "link stage 1 -> 0 (wrap-around, emulated)" in result.stdout


@pytest.mark.slow
def test_two_groups_with_ministages_zero2_and_offload_resume_from_a_checkpoint_bit_for_bit(tmp_path):
    data = two_groups(offload=("activations", "parameters"))
    half = {"checkpoint_every": 2, "keep_checkpoints": 5, "lr_decay_steps": 4, "warmup_steps": 1}
    uninterrupted, _ = run_pipeline(data, 4, train=half)
    out = str(tmp_path / "run")
    run_pipeline(data, 2, out_dir=out, train=half)
    resumed, _ = run_pipeline(data, 4, out_dir=out, train=half, start={"resume": True})
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in resumed] == \
        [(r["step"], r["loss"], r["grad_norm"]) for r in uninterrupted]
