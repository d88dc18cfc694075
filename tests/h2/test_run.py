"""`h2 run`: a cluster file to a trained, checked model in one command, as a user runs it; its steps
`h2 profile`, `h2 plan`, `h2 check`; bad input refused in one line before anything in --out changes."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from h2.core.model_config import preset

# Two emulated chip types for the tiny model, one chip each: a profile and a 3-step run stay short.
CLUSTER = {
    "name": "test-run",
    "model": "tiny",
    "chips": [
        {
            "name": "emu-big", "count": 1, "memory_gb": 0.008, "usable_memory_fraction": 0.9, "chips_per_node": 1,
            "tp_max": 1, "intra_node_gbps": 2, "inter_node_gbps": 1, "peak_tflops": 0.02, "emulation": {
                "relative_speed": 0.2
            }
        },
        {
            "name": "emu-small", "count": 1, "memory_gb": 0.004, "usable_memory_fraction": 0.9, "chips_per_node": 1,
            "tp_max": 1, "intra_node_gbps": 2, "inter_node_gbps": 1, "peak_tflops": 0.04, "emulation": {
                "relative_speed": 0.4
            }
        },
    ],
    "training": {
        "seq_len": 32, "global_batch_sequences": 4, "micro_batch_size": 2, "zero1": False, "weight_bytes": 4,
        "gradient_bytes": 4, "optimizer_bytes": 8, "activation_bytes_per_element": 4
    },
}


def write_cluster(directory) -> str:
    path = os.path.join(directory, "cluster.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(CLUSTER, handle, sort_keys=False)
    return path


def fake_run(directory, model: str) -> str:
    """A run folder as h2 run leaves it: its plan names the model, its metrics a loss curve."""
    os.makedirs(directory)
    with open(os.path.join(directory, "plan.json"), "w") as handle:
        json.dump({"model": model, "model_config": preset(model).to_dict()}, handle)
    with open(os.path.join(directory, "metrics.jsonl"), "w") as handle:
        handle.writelines(json.dumps({"step": step, "loss": 5.0 - step}) + "\n" for step in (1, 2, 3))
    return str(directory)


def folder_state(directory) -> dict:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def one_line(result) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_missing_cluster_file_is_one_line_and_leaves_out_untouched(cli, tmp_path):
    out = fake_run(tmp_path / "out", "tiny")
    before = folder_state(out)
    result = cli("h2", "run", "--cluster", str(tmp_path / "nope.yaml"), "--out", out, "--overwrite")
    assert "nope.yaml: no such file" in one_line(result)
    assert folder_state(out) == before


def test_a_reference_run_of_another_model_is_refused_before_anything_is_written(cli, tmp_path):
    reference = fake_run(tmp_path / "ref", "small")
    out = fake_run(tmp_path / "out", "tiny")
    before = folder_state(out)
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", out, "--overwrite", "--reference",
                 reference)
    assert "a run of model 'small', this run trains 'tiny'" in one_line(result)
    assert folder_state(out) == before


def test_an_out_folder_holding_a_run_is_refused_without_overwrite(cli, tmp_path):
    out = fake_run(tmp_path / "out", "tiny")
    before = folder_state(out)
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", out)
    assert "holds an earlier run" in one_line(result)
    assert folder_state(out) == before


def test_several_hosts_without_a_rendezvous_endpoint_is_one_line(cli, tmp_path):
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", str(tmp_path / "out"), "--nnodes", "2")
    assert "--nnodes 2 needs --rdzv-endpoint" in one_line(result)
    assert not (tmp_path / "out").exists()


def test_check_of_a_folder_without_a_plan_is_one_line(cli, tmp_path):
    result = cli("h2", "check", "--run", str(tmp_path))
    assert "no plan.json" in one_line(result)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One `h2 run` on the two emulated chips, compared with the single-device trainer on the same batches."""
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("h2run")
    reference = root / "reference"
    trained = run_cli("h2", "train", "--preset", "tiny", "--steps", "3", "--micro-batch-size", "2", "--micro-batches",
                      "2", "--seq-len", "32", "--warmup-steps", "0", "--out", str(reference), "--quiet")
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = root / "run"
    result = run_cli("h2", "run", "--cluster", write_cluster(root), "--profiles", str(root / "profiles"), "--out",
                     str(out), "--steps", "3", "--warmup-steps", "0", "--reference", str(reference), "--trace",
                     str(root / "trace"), timeout=600)
    return result, out, root


def test_run_prints_the_plan_with_predicted_step_time_and_memory(finished_run):
    result, _, _ = finished_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "plan for model tiny on cluster test-run" in result.stdout
    assert "emu-big (emulated" in result.stdout
    assert "predicted step time:" in result.stdout


def test_run_shows_progress_with_tokens_per_chip_type_and_memory_per_stage(finished_run):
    result, _, _ = finished_run
    progress = [line for line in result.stdout.splitlines() if re.match(r"step \d+ loss ", line)]
    assert len(progress) == 3, result.stdout
    assert "per chip: emu-big" in progress[-1] and "peak MB per stage 0:" in progress[-1]


def test_run_ends_with_measured_against_predicted_step_time(finished_run):
    result, out, _ = finished_run
    summary = json.load(open(out / "summary.json"))
    assert "step time: measured" in result.stdout and "vs predicted" in result.stdout
    assert summary["measured_step_s"] > 0 and summary["simulator_step_s"] > 0


def test_run_matches_the_single_device_reference_within_the_precision_threshold(finished_run):
    result, out, _ = finished_run
    summary = json.load(open(out / "summary.json"))
    assert summary["precision"]["passed"] and summary["precision"]["mre"] < 1e-3, summary["precision"]
    assert (out / "precision-diff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_run_reuses_the_cached_profiles(finished_run, cli):
    _, out, root = finished_run
    result = cli("h2", "profile", "--cluster", str(root / "cluster.yaml"), "--profiles", str(root / "profiles"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("up to date in") == 2, result.stdout


def test_a_run_folder_is_a_reference_of_its_own_model_only(finished_run, cli, tmp_path):
    _, out, root = finished_run
    result = cli("h2", "check", "--run", str(out), "--reference", str(root / "reference"))
    assert result.returncode == 0, result.stderr
    assert "PASS" in result.stdout


# ---- traces -----------------------------------------------------------------------------------------
def trace_events(path) -> list[dict]:
    with open(path) as handle:
        return json.load(handle)["traceEvents"]


def test_the_measured_trace_has_one_named_track_per_rank(finished_run):
    _, _, root = finished_run
    events = trace_events(root / "trace" / "measured.json")
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = {e["pid"] for e in events if e["ph"] == "X"}
    assert named == spans == {0, 1}


def test_the_measured_trace_holds_forward_backward_send_recv_and_all_reduce_spans(finished_run):
    _, _, root = finished_run
    kinds = {e["cat"] for e in trace_events(root / "trace" / "measured.json") if e["ph"] == "X"}
    assert {"forward", "backward", "send", "recv", "all-reduce"} <= kinds, kinds


def test_the_predicted_trace_has_one_track_per_stage_in_the_same_format(finished_run):
    _, out, root = finished_run
    stages = len(yaml.safe_load(open(out / "strategy.yaml"))["stages"])
    events = trace_events(root / "trace" / "predicted.json")
    assert {e["pid"] for e in events if e["ph"] == "X"} == set(range(stages))
    assert {"forward", "backward"} <= {e["cat"] for e in events if e["ph"] == "X"}


# ---- resume -----------------------------------------------------------------------------------------
def planned_folder(directory, cluster: dict, model: str = "tiny") -> str:
    """A folder as `h2 plan` leaves it for `cluster` (its fields as plan.json records them) and `model`."""
    from h2.cli.run import cluster_identity
    from h2.core.cluster import load_cluster

    os.makedirs(directory)
    path = os.path.join(directory, "planned-cluster.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(cluster, handle, sort_keys=False)
    with open(os.path.join(directory, "plan.json"), "w") as handle:
        json.dump(
            {
                "cluster": path, "cluster_config": cluster_identity(load_cluster(path)), "model": model,
                "model_config": preset(model).to_dict()
            }, handle)
    with open(os.path.join(directory, "strategy.yaml"), "w") as handle:
        yaml.safe_dump({"model": model, "stages": []}, handle)
    os.remove(path)
    return str(directory)


def test_resume_of_a_folder_planned_for_another_cluster_is_one_line_and_changes_nothing(cli, tmp_path):
    out = planned_folder(tmp_path / "out", {**CLUSTER, "name": "elsewhere"})
    before = folder_state(out)
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", out, "--resume", "--steps", "5")
    assert "planned for cluster 'elsewhere'" in one_line(result)
    assert folder_state(out) == before


def test_resume_with_a_cluster_file_whose_chips_changed_is_refused(cli, tmp_path):
    chips = [{**CLUSTER["chips"][0], "memory_gb": 0.016}, CLUSTER["chips"][1]]
    out = planned_folder(tmp_path / "out", {**CLUSTER, "chips": chips})
    before = folder_state(out)
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", out, "--resume")
    assert "'test-run' with other chip types" in one_line(result)
    assert folder_state(out) == before


def test_resume_of_a_folder_of_another_model_is_one_line_and_changes_nothing(cli, tmp_path):
    out = planned_folder(tmp_path / "out", CLUSTER, model="small")
    before = folder_state(out)
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", out, "--resume")
    assert "a run of model 'small', this run trains 'tiny'" in one_line(result)
    assert folder_state(out) == before


def test_resume_of_a_folder_without_a_run_is_one_line(cli, tmp_path):
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path), "--out", str(tmp_path / "empty"), "--resume")
    assert "holds no run to continue" in one_line(result)
    assert not (tmp_path / "empty").exists()


def test_resume_continues_the_run_with_its_plan_and_the_checkpoint_flags(finished_run, cli, tmp_path):
    import shutil

    _, finished, root = finished_run
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    strategy = (out / "strategy.yaml").read_bytes()
    result = cli("h2", "run", "--cluster", str(root / "cluster.yaml"), "--out", str(out), "--resume", "--steps", "5",
                 "--warmup-steps", "0", "--checkpoint-every", "1", "--keep-checkpoints", "1", "--max-restarts", "0",
                 "--rank-timeout", "120", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "plan for model" not in result.stdout and "resuming from step 3" in result.stdout
    assert (out / "strategy.yaml").read_bytes() == strategy
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5]
    kept = sorted(name for name in os.listdir(out / "checkpoints") if name.startswith("step_"))
    assert kept == ["step_00000005"]
    assert json.load(open(out / "summary.json"))["steps"] == 5


# ---- the cluster file is read once per command --------------------------------------------------------
@pytest.fixture
def cluster_reads(monkeypatch, tmp_path):
    """The cluster file of this test, and a count of the times it is opened."""
    import builtins

    path = write_cluster(tmp_path)
    opened = builtins.open
    reads = []

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == os.path.abspath(path):
            reads.append(file)
        return opened(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    return path, reads


@pytest.fixture
def measured_instantly(monkeypatch):
    """Measuring a chip answers at once (a fixed measurement) instead of running its ranks."""
    from heteropp import profiling

    def measure_tp(chip, model, tp, **_):
        return profiling.TPMeasurement(tp=tp, forward_s=1e-3, backward_s=2e-3, recompute_s=1e-3, activation_bytes=1000,
                                       recompute_activation_bytes=100, workspace_bytes=None, update_s=1e-4,
                                       embedding_forward_s=0.0, embedding_backward_s=0.0, head_forward_s=0.0,
                                       head_backward_s=0.0, device="dipu:0", late_fraction=0.0)

    monkeypatch.setattr(profiling, "measure_tp", measure_tp)


def test_h2_plan_reads_the_cluster_file_once(cluster_reads, tmp_path, capsys):
    from h2.cli.main import main

    path, reads = cluster_reads
    os.makedirs(tmp_path / "profiles")
    status = main([
        "plan", "--cluster", path, "--profiles",
        str(tmp_path / "profiles"), "--out",
        str(tmp_path / "plan")
    ])
    assert status == 0, capsys.readouterr().err
    assert len(reads) == 1 and (tmp_path / "plan" / "strategy.yaml").exists()


def test_h2_run_reads_the_cluster_file_once_to_profile_plan_and_launch(cluster_reads, measured_instantly, tmp_path,
                                                                       monkeypatch, capsys):
    from h2.cli.main import main
    from h2.launch import launcher

    path, reads = cluster_reads
    reads_at_launch = []
    monkeypatch.setattr(launcher, "launch", lambda *args, **kwargs: reads_at_launch.append(len(reads)) or 1)
    status = main(["run", "--cluster", path, "--profiles", str(tmp_path / "profiles"), "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert status == 1 and "wrote " in out and "plan for model tiny" in out, out
    assert reads_at_launch == [1]
