"""A vendor per chip type (a cluster file's `vendor: host|opencl`): validated on load, carried per rank by the
job file, loaded by each rank before its device opens, keyed into the planner's profiles; and a 2-stage
pipeline with stage 0 on the host vendor and stage 1 on OpenCL that trains as the single-device CPU run."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from conftest import run_python
from h2.core.cluster import load_cluster
from h2.core.errors import UserError

TRAINING = {
    "seq_len": 32, "global_batch_sequences": 4, "micro_batch_size": 2, "zero1": False, "weight_bytes": 4,
    "gradient_bytes": 4, "optimizer_bytes": 8, "activation_bytes_per_element": 4
}


def chip(name: str, memory_gb: float, **fields) -> dict:
    entry = {
        "name": name, "count": 1, "memory_gb": memory_gb, "chips_per_node": 1, "tp_max": 1, "intra_node_gbps": 2,
        "inter_node_gbps": 1
    }
    entry.update(fields)
    return entry


# The OpenCL chip holds too little for stage 0 without recompute (its micro-batches' activations) but enough for
# the last stage with one layer: first it would recompute, so the planner puts the host vendor's chip first and
# the OpenCL chip second (10 % faster on the profiles a CI run measured: test_search_prices_ends_as_evaluated).
MIXED = {
    "name": "mixed-vendor", "model": "tiny", "chips": [
        chip("host-chip", 0.008, vendor="host", peak_tflops=0.02),
        chip("ocl-chip", 0.0018, vendor="opencl", peak_tflops=0.04)
    ], "training": TRAINING
}


def write_cluster(directory, cluster: dict) -> str:
    path = os.path.join(directory, "cluster.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(cluster, handle, sort_keys=False)
    return path


def test_a_chip_type_names_its_vendor_and_a_wrong_one_is_one_line(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, MIXED))
    assert [(c.name, c.vendor, c.dipu_vendor, c.on_dipu)
            for c in cluster.chips] == [("host-chip", "host", "host", True), ("ocl-chip", "opencl", "opencl", True)]
    plain = load_cluster(write_cluster(tmp_path, {**MIXED, "chips": [chip("cpu-chip", 0.008)]})).chips[0]
    assert (plain.vendor, plain.dipu_vendor, plain.on_dipu) == (None, "host", False)
    wrong = {**MIXED, "chips": [chip("x", 0.008, vendor="cuda")]}
    with pytest.raises(UserError, match=r"chip 'x': field 'vendor' must be one of host, opencl, got 'cuda'"):
        load_cluster(write_cluster(tmp_path, wrong))
    emulated = {**MIXED, "chips": [chip("x", 0.008, vendor="opencl", emulated=True, emulation={"relative_speed": 0.5})]}
    (opencl_chip, ) = load_cluster(write_cluster(tmp_path,
                                                 emulated)).chips  # emulated on OpenCL (test_opencl_emulation)
    assert (opencl_chip.dipu_vendor, opencl_chip.emulation.relative_speed) == ("opencl", 0.5)


def test_profiles_are_keyed_per_chip_type_and_vendor(tmp_path):
    import dataclasses

    from h2.core.model_config import preset
    from heteroauto.profiles import profile_fingerprint

    cluster = load_cluster(write_cluster(tmp_path, MIXED))
    host = cluster.chip("host-chip")
    as_opencl = dataclasses.replace(host, vendor="opencl")
    model = preset("tiny")
    assert profile_fingerprint(cluster, host, model, cluster.training) != profile_fingerprint(
        cluster, as_opencl, model, cluster.training)


def test_the_job_file_carries_each_ranks_vendor_and_the_rank_loads_it(tmp_path):
    from h2.core.strategy import load_strategy
    from h2.launch.job import read_job
    from h2.launch.pipeline_job import rank_entries

    cluster = load_cluster(write_cluster(tmp_path, MIXED))
    strategy_path = tmp_path / "strategy.yaml"
    strategy_path.write_text("dp: 1\nmicro_batches: 2\nmicro_batch_size: 2\nseq_len: 32\nmodel: tiny\nstages:\n"
                             "- {chip: host-chip, tp: 1, layers: 3}\n- {chip: ocl-chip, tp: 1, layers: 1}\n")
    strategy = load_strategy(str(strategy_path))
    from h2.core.emulation import emulated_stage_devices

    strategy = emulated_stage_devices(strategy, cluster, str(strategy_path))
    assert [stage.device for stage in strategy.stages] == ["dipu", "dipu"]
    entries = rank_entries(strategy, _train_config(), cluster)
    assert [(entry.chip, entry.vendor) for entry in entries] == [("host-chip", "host"), ("ocl-chip", "opencl")]
    job_path = _write_job(tmp_path, strategy, entries)
    assert [entry.vendor for entry in read_job(job_path).ranks] == ["host", "opencl"]
    for rank, vendor in enumerate(("host", "opencl")):
        loaded = run_python(
            f"""
            import os
            from h2.cli.rank import open_chip
            from h2.launch.job import read_job
            open_chip(read_job({str(job_path)!r}), {rank})
            import torch, ditorch.dipu as dipu
            torch.ones(2, device="dipu").cpu()
            print(os.environ["DIPU_VENDOR"], dipu.vendor_name())
        """, DIPU_VENDOR="")
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout.split() == [vendor, vendor]


def _train_config():
    from h2.core.training import TrainConfig

    return TrainConfig(device="cpu", seq_len=32, micro_batch_size=2, micro_batches=2)


def _write_job(tmp_path, strategy, entries) -> str:
    from h2.core.dips import PSOptions
    from h2.core.training import PipelineOptions
    from h2.launch.job import ResolvedJob, write_job

    path = str(tmp_path / "job.yaml")
    write_job(
        path,
        ResolvedJob(source="strategy.yaml", strategy=strategy, train=_train_config(), pipeline=PipelineOptions(),
                    ps=PSOptions(), out=str(tmp_path / "out"), ranks=entries))
    return path


@pytest.mark.slow
def test_a_pipeline_with_a_host_stage_and_an_opencl_stage_trains_as_the_cpu_run(cli, tmp_path):
    """`h2 run` on one cluster file: stage 0 on the host vendor, stage 1 on OpenCL, 20 steps; `h2 check`
    prints the loss curve's MRE against the single-device CPU run (within the 1.5 % threshold)."""
    reference = tmp_path / "reference"
    trained = cli("h2", "train", "--preset", "tiny", "--steps", "20", "--micro-batch-size", "2", "--micro-batches", "2",
                  "--seq-len", "32", "--warmup-steps", "0", "--out", str(reference), "--quiet")
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = tmp_path / "run"
    result = cli("h2", "run", "--cluster", write_cluster(tmp_path, MIXED), "--profiles", str(tmp_path / "profiles"),
                 "--out", str(out), "--steps", "20", "--warmup-steps", "0", "--reference", str(reference), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"stage 0 \(host-chip\) on the host vendor: peak memory", result.stdout), result.stdout
    assert re.search(r"stage 1 \(ocl-chip\) on the opencl vendor: peak memory", result.stdout), result.stdout
    assert re.search(r"PASS: MRE \d+\.\d+% < 1\.5000%", result.stdout), result.stdout
    summary = json.load(open(out / "summary.json"))
    assert [row["vendor"] for row in summary["memory"]] == ["host", "opencl"]
    assert summary["steps"] == 20 and summary["precision"]["passed"] and summary["precision"]["mre"] < 0.015
    checked = cli("h2", "check", "--run", str(out), "--reference", str(reference))
    assert checked.returncode == 0, checked.stderr
    assert "on the opencl vendor" in checked.stdout and re.search(r"PASS: MRE .* < 1\.5000%", checked.stdout)
