"""The Metis bridge (benchmarks/metis/to_metis.py) hands Metis its inputs in Metis's units."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "metis"))

import to_metis  # noqa: E402

CLUSTER = os.path.join(ROOT, "benchmarks", "metis", "cluster.yaml")


def metis_transfer_ms(size_bytes: float, bandwidth: float) -> float:
    """Metis's model/cost_estimator.py `_get_pp_cost`: size / (bandwidth * 1024 * 1024), added to times in ms."""
    return size_bytes / (bandwidth * 1024 * 1024)


def test_a_transfer_priced_by_metis_from_the_bridge_s_clusterfile_comes_out_in_milliseconds(tmp_path):
    to_metis.write_inputs(CLUSTER, str(tmp_path))
    nodes = json.loads((tmp_path / "clusterfile.json").read_text())
    cluster, _, _ = to_metis.problem(CLUSTER)
    for node in nodes.values():
        chip = cluster.chip(node["instance_type"])
        one_gb = 1e9
        assert metis_transfer_ms(one_gb, node["inter_bandwidth"]) == pytest.approx(1e3 / chip.inter_node_gbps)
        assert metis_transfer_ms(one_gb, node["intra_bandwidth"]) == pytest.approx(1e3 / chip.intra_node_gbps)
