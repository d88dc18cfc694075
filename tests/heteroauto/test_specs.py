import os

import pytest

from autohelpers import CLUSTERS
from h2.core.cluster import load_cluster, parse_count
from h2.core.errors import UserError

PAPER = {
    "exp-a-1": ({"A": 256, "B": 256, "C": 256}, 2), "exp-a-2": ({"A": 256, "B": 256, "C": 256}, 6), "exp-b-1": ({
        "A": 256, "B": 256, "C": 256, "D": 256
    }, 2), "exp-b-2": ({"A": 256, "B": 256, "C": 256, "D": 256}, 8), "exp-c-1": ({"A": 384, "B": 1024}, 4),
    "exp-c-2": ({"A": 384, "B": 1024}, 8), "exp-d": ({"A": 384, "B": 2048}, 8)
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_cluster_files_carry_table7_chips_and_batch(name):
    cluster = load_cluster(os.path.join(CLUSTERS, f"{name}.yaml"))
    chips, millions = PAPER[name]
    assert {c.name: c.count for c in cluster.chips} == chips
    assert cluster.training.tokens == millions * 2**20
    assert cluster.training.seq_len == 4096 and cluster.model == "h2-100b"


def test_chip_types_come_in_descending_memory_order():
    cluster = load_cluster(os.path.join(CLUSTERS, "exp-b-1.yaml"))
    assert [c.name for c in cluster.by_descending_memory()][:2] == ["A", "B"]


def test_counts_accept_binary_suffixes():
    assert parse_count("4M", "x") == 4 * 2**20
    assert parse_count("512K", "x") == 512 * 1024
    assert parse_count(4096, "x") == 4096
    with pytest.raises(UserError, match="--gbs-tokens"):
        parse_count("lots", "--gbs-tokens")


CHIP = "{name: X, count: 8, memory_gb: 32, chips_per_node: 8, tp_max: 8, intra_node_gbps: 100, inter_node_gbps: 10}"


@pytest.mark.parametrize("text, error", [
    pytest.param("chips: [\n  {name: X\n", r"c.yaml: malformed YAML \(line", id="malformed_yaml_names_file_and_line"),
    pytest.param(
        "chips:\n  - {name: X, count: many, memory_gb: 32, chips_per_node: 8, tp_max: 8, "
        "intra_node_gbps: 100, inter_node_gbps: 10}\n", r"c.yaml: chips\[0\]: field 'count': expected an integer",
        id="wrong_field_type_names_file_chip_and_field"),
    pytest.param(f"chips: [{CHIP}]\nchipz: 1\n", "unknown field 'chipz'", id="unknown_field_is_refused"),
    pytest.param(f"chips: [{CHIP.replace('tp_max: 8', 'tp_max: 16')}]\n", "tp_max",
                 id="tp_max_beyond_a_node_is_refused"),
    pytest.param(f"chips: [{CHIP}]\ntraining: {{seq_len: 4096, global_batch_tokens: 1000}}\n",
                 "training: field 'global_batch_tokens'",
                 id="training_batch_must_be_a_multiple_of_the_sequence_length"),
])
def test_a_bad_cluster_file_is_refused_with_an_error_naming_what_is_wrong(write, text, error):
    with pytest.raises(UserError, match=error):
        load_cluster(write("c.yaml", text))


def test_chip_spec_can_come_from_a_chip_file(write):
    write("x.yaml", "name: X\nmemory_gb: 32\nchips_per_node: 8\ntp_max: 4\nintra_node_gbps: 100\ninter_node_gbps: 10\n")
    path = write("c.yaml", "chips:\n  - {from: x.yaml, count: 16}\n")
    chip = load_cluster(path).chip("X")
    assert (chip.count, chip.tp_max, chip.tp_sizes()) == (16, 4, [1, 2, 4])
