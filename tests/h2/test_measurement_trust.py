"""Measurements that say when they cannot be trusted (h2.core.emulation.measurement_trust): the verdict, the
pacer's, `heteroauto profile` refusing an INVALID profile unless --force, `h2 check`'s line, and the
closed-loop benchmarks printing INVALID (exit 3) instead of PASS."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from h2.cli import heteroauto
from h2.core.emulation import UNTRUSTED_FRACTION, measurement_trust, stage_report_trust
from h2.train import pacing
from heteropp import profiling

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO_ROOT, "configs", "clusters", "local-emulated.yaml")
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))


def test_the_threshold_is_five_percent_of_the_measured_time():
    assert UNTRUSTED_FRACTION == 0.05
    assert measurement_trust(5.0, 100.0).trusted
    assert not measurement_trust(5.01, 100.0).trusted
    assert measurement_trust(0.0, 0.0).trusted  # nothing emulated: nothing the host could make late
    assert measurement_trust(1.79, 1.0).describe() == (
        "INVALID: 179.0% of the emulated kernel time late (1.790 of 1.000 s; limit 5%): it measured the host's "
        "load, not the emulated chips")
    assert measurement_trust(0.004, 1.0).describe().startswith("trusted: 0.4% of the emulated kernel time late")


def test_a_runs_verdict_sums_its_stages_late_and_emulated_time():
    rows = [{"overrun_s": 0.01, "emulated_s": 1.0}, {"overrun_s": 0.2, "emulated_s": 1.0}]
    assert stage_report_trust(rows).fraction == pytest.approx(0.105) and not stage_report_trust(rows).trusted
    assert stage_report_trust([{"overrun_s": 0.0, "emulated_s": 0.0, "peak_allocated_bytes": 1}]).trusted


def test_the_pacers_verdict_counts_by_how_much_steps_overran(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(pacing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(pacing.time, "sleep", lambda seconds: None)
    pacer = pacing.Pacer(1.0)
    for compute_s in (0.5, 1.3, 0.9, 1.0):
        now[0] = compute_s
        pacer.pad(0.0)
    assert pacer.overruns == 1 and pacer.overrun_s == pytest.approx(0.3)
    trust = pacer.trust()
    assert trust.what == "paced step time" and trust.fraction == pytest.approx(0.3 / 4) and not trust.trusted


def fake_measurements(monkeypatch, late: float) -> list[int]:
    """measure_tp answering at once with `late` of the emulated kernel time late; the TP sizes measured."""
    calls = []

    def fake_measure_tp(chip, model, tp, **_):
        calls.append(tp)
        return profiling.TPMeasurement(tp=tp, forward_s=0.01, backward_s=0.02, recompute_s=0.01, activation_bytes=1,
                                       recompute_activation_bytes=1, workspace_bytes=None, update_s=0.001,
                                       embedding_forward_s=0.0, embedding_backward_s=0.0, head_forward_s=0.0,
                                       head_backward_s=0.0, device="dipu:0", late_fraction=late)

    monkeypatch.setattr(profiling, "measure_tp", fake_measure_tp)
    return calls


def profile(tmp_path, *extra: str) -> int:
    return heteroauto.main([
        "profile", "--cluster", CLUSTER, "--chip", "emu-small", "--repeats", "1", "--out-dir",
        str(tmp_path), *extra
    ])


def test_an_invalid_profile_is_refused_in_one_line_exit_2_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    calls = fake_measurements(monkeypatch, late=0.2)
    assert profile(tmp_path) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "heteroauto: error: INVALID profile of chip 'emu-small' not written: 20.0% of its emulated kernel time at tp "
        "1 ran late (the host's load, not the chip; limit 5%); measure on a quieter host, or --force to write it "
        "marked untrusted")
    assert not (tmp_path / "emu-small.yaml").exists()
    assert calls == [1, 1]  # refused at the first TP size (taken again once, as --attempts 2 says), not tp 2


def test_forced_an_invalid_profile_is_written_marked_untrusted_and_measured_again_next_time(
        tmp_path, monkeypatch, capsys):
    fake_measurements(monkeypatch, late=0.2)
    assert profile(tmp_path, "--force") == 0
    written = yaml.safe_load((tmp_path / "emu-small.yaml").read_text())
    assert written["trusted"] is False and written["late_fraction"] == pytest.approx(0.2)
    assert "UNTRUSTED: 20.0% of its emulated kernel time ran late" in capsys.readouterr().out
    calls = fake_measurements(monkeypatch, late=0.01)
    assert profile(tmp_path) == 0 and calls  # the untrusted file is not reused from the cache
    assert "trusted" not in yaml.safe_load((tmp_path / "emu-small.yaml").read_text())


def test_a_trusted_profile_is_written_and_reused(tmp_path, monkeypatch):
    fake_measurements(monkeypatch, late=UNTRUSTED_FRACTION)
    assert profile(tmp_path) == 0
    calls = fake_measurements(monkeypatch, late=0.0)
    assert profile(tmp_path) == 0 and calls == []


def test_h2_check_marks_a_run_with_late_kernels_invalid(capsys):
    from h2.cli.run import measurement_verdict

    verdict = measurement_verdict([{"overrun_s": 0.3, "emulated_s": 1.0}])
    assert verdict == {"trusted": False, "late_fraction": pytest.approx(0.3)}
    assert capsys.readouterr().out.startswith("measurement INVALID: 30.0% of the emulated kernel time late")
    assert measurement_verdict([{"overrun_s": 0.01, "emulated_s": 1.0}])["trusted"]


def test_the_benchmarks_print_invalid_instead_of_pass_and_exit_3(capsys):
    from bench_closed_loop import EXIT_FAIL, EXIT_INVALID, verdicts

    checks = [(True, "planned step within 15% of the simulator (1.0%)"), (False, "planned at least 1.3x faster")]
    late = {"planned run": measurement_trust(0.5, 1.0), "profile emu-fast": measurement_trust(0.0, 1.0)}
    assert verdicts(checks, late) == EXIT_INVALID == 3
    out = capsys.readouterr().out
    assert "PASS" not in out and "FAIL" not in out
    assert out.splitlines() == [
        "INVALID measurement, planned run: INVALID: 50.0% of the emulated kernel time late (0.500 of 1.000 s; "
        "limit 5%): it measured the host's load, not the emulated chips",
        "INVALID planned step within 15% of the simulator (1.0%)", "INVALID planned at least 1.3x faster"
    ]
    on_time = {"planned run": measurement_trust(0.01, 1.0)}
    assert verdicts(checks, on_time) == EXIT_FAIL
    assert capsys.readouterr().out.splitlines() == [
        "PASS planned step within 15% of the simulator (1.0%)", "FAIL planned at least 1.3x faster"
    ]
    assert verdicts(checks[:1], on_time) == 0


def test_a_benchmark_whose_profile_step_refuses_its_measurement_prints_invalid_and_exits_3(
        monkeypatch, capsys, tmp_path):
    import subprocess

    import bench_closed_loop

    refusal = ("heteroauto: error: INVALID profile of chip 'emu-fast' not written: 822.0% of its emulated kernel "
               "time at tp 1 ran late (the host's load, not the chip; limit 5%); measure on a quieter host, or "
               "--force to write it marked untrusted\n")
    monkeypatch.setattr(bench_closed_loop.subprocess, "run",
                        lambda command, **_: subprocess.CompletedProcess(command, 2, stderr=refusal))
    with pytest.raises(SystemExit) as ended:
        bench_closed_loop.profile("cluster.yaml", str(tmp_path))
    assert ended.value.code == 3
    out = capsys.readouterr().out
    assert out.startswith("INVALID: the profile step refused its measurement (exit 2): INVALID profile of chip "
                          "'emu-fast' not written: 822.0%") and "PASS" not in out


@pytest.mark.parametrize("reuse", [False, True])
def test_a_closed_loop_measures_its_profiles_afresh_unless_told_to_reuse_them(monkeypatch, tmp_path, reuse):
    """An emulated chip runs at a fraction of the host's speed at the time: the profile step sees no
    cached profile (heteroauto profile would take an up-to-date one) unless --reuse-profiles."""
    import subprocess

    import bench_closed_loop

    (tmp_path / "emu-fast.yaml").write_text("cached: yes\n")
    seen = []

    def profile_step(command, **_):
        seen.append(sorted(os.listdir(tmp_path)))
        return subprocess.CompletedProcess(command, 0, stderr="")

    monkeypatch.setattr(bench_closed_loop.subprocess, "run", profile_step)
    monkeypatch.setattr(bench_closed_loop, "profile_trust", lambda folder: {})
    bench_closed_loop.profile("cluster.yaml", str(tmp_path), reuse=reuse)
    assert seen == [["emu-fast.yaml"] if reuse else []]


@pytest.mark.parametrize("busy_ticks, refused", [(60, True), (40, False)])
def test_a_closed_loop_on_a_host_other_work_keeps_busy_is_invalid_before_it_starts(monkeypatch, capsys, busy_ticks,
                                                                                   refused):
    """Over 1 - CORE_SHARE_LIMIT of the cores busy with other work in the sampled window: INVALID, exit 3."""
    import bench_closed_loop

    samples = iter([(1000, 5000), (1000 + 100 - busy_ticks, 5100)])  # (idle, total) ticks before and after
    monkeypatch.setattr(bench_closed_loop, "cpu_times", lambda: next(samples))
    if not refused:
        bench_closed_loop.refuse_a_busy_host(window_s=0)
        assert capsys.readouterr().out == ""
        return
    with pytest.raises(SystemExit) as ended:
        bench_closed_loop.refuse_a_busy_host(window_s=0)
    assert ended.value.code == 3
    assert capsys.readouterr().out.startswith("INVALID: other work kept 60% of the host's cores busy")
