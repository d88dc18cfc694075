"""`heteroauto profile` takes a TP size again when its emulated kernels ran late (the host's load, not
the chip) and keeps the least late measurement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from h2.core.cluster import load_cluster
from h2.launch.profiling_job import MeasureOptions, measure
from heteroauto.profile_cache import ProfileTarget
from heteropp import profiling

CLUSTER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs",
                       "clusters", "local-hetero.yaml")


def measurement(tp: int, late: float) -> profiling.TPMeasurement:
    return profiling.TPMeasurement(tp=tp, forward_s=1.0 + late, backward_s=2.0, recompute_s=1.0, activation_bytes=1,
                                   recompute_activation_bytes=1, workspace_bytes=None, update_s=0.1,
                                   embedding_forward_s=0.0, embedding_backward_s=0.0, head_forward_s=0.0,
                                   head_backward_s=0.0, device="dipu:0", late_fraction=late)


@pytest.fixture
def emu_slow(monkeypatch, tmp_path):
    """emu-slow of the shipped cluster (tp 1 and 2) with measure_tp answering from `lateness` in turn."""
    lateness, calls = [], []

    def fake_measure_tp(chip, model, tp, **_):
        calls.append(tp)
        return measurement(tp, lateness.pop(0))

    monkeypatch.setattr(profiling, "measure_tp", fake_measure_tp)
    cluster = load_cluster(CLUSTER)
    chip = cluster.chip("emu-slow")

    def run(late_in_turn: list[float], attempts: int = 2, max_late: float = 0.1) -> tuple[dict, list[int]]:
        lateness[:] = late_in_turn
        options = MeasureOptions(device="cpu", repeats=1, attempts=attempts, max_late=max_late)
        measured = measure(cluster, [ProfileTarget(chip, str(tmp_path / "emu-slow.yaml"))], None, cluster.training,
                           options)
        return {entry["tp"]: entry["late_fraction"] for entry in measured["emu-slow"]}, list(calls)

    return run


def test_a_late_measurement_is_taken_again_and_the_least_late_kept(emu_slow):
    kept, calls = emu_slow([0.5, 0.05, 0.02])
    assert calls == [1, 1, 2] and kept == {1: 0.05, 2: 0.02}


def test_a_measurement_within_max_late_is_taken_once(emu_slow):
    kept, calls = emu_slow([0.05, 0.0])
    assert calls == [1, 2] and kept == {1: 0.05, 2: 0.0}


def test_attempts_bound_the_measurements_of_a_late_tp_size(emu_slow):
    kept, calls = emu_slow([0.5, 0.4, 0.3, 0.9], attempts=2)
    assert calls == [1, 1, 2, 2] and kept == {1: 0.4, 2: 0.3}


def test_zero_attempts_is_one_line_exit_2():
    result = subprocess.run([
        sys.executable, "-m", "h2.cli.heteroauto", "profile", "--cluster", CLUSTER, "--attempts", "0"
    ], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == "heteroauto: error: --attempts: must be at least 1"
