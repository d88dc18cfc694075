"""The stage report (stage_report.json) counts the host CPU each stage's ranks spent inside steps,
the figure that shows whether the host could feed emulated chips (benchmarks/bench_closed_loop.py)."""

from __future__ import annotations

from heteropp_launch import run_pipeline


def test_each_stage_reports_the_host_cpu_its_ranks_spent_in_steps_and_no_more_than_their_wall_time():
    data = {
        "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "seq_len": 16, "model": "tiny",
        "stages": [{"chip": "chip-a", "tp": 1, "layers": 3}, {"chip": "chip-b", "tp": 1, "layers": 1}]
    }
    _, ranks = run_pipeline(data, 2)
    report = ranks[0]["stage_report"]
    for row in report:
        wall = sum(rank["elapsed_s"] for rank in ranks if rank["stage"] == row["stage"])
        assert 0 < row["host_cpu_s"] <= wall * 1.05, (row, wall)
