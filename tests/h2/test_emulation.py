"""Emulated chips in the cluster file (h2.core.emulation): the `emulation:` section, the host vendor
profile it becomes, and the trust rule over the ranks of one host."""

import os
import subprocess
import sys

import pytest

from h2.core.cluster import load_cluster
from h2.core.emulation import (
    CORE_SHARE_LIMIT,
    check_core_share,
    emulated_stage_devices,
    host_vendor_settings,
    host_work_warning,
    rank_chips,
)
from h2.core.errors import UserError
from h2.core.strategy import strategy_from_mapping

CHIP = """  - name: {name}
    count: {count}
    memory_gb: {memory}
    chips_per_node: 2
    tp_max: 2
    intra_node_gbps: 2
    inter_node_gbps: 1
{extra}"""


def cluster_file(tmp_path, *chips: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: test\nchips:\n" + "".join(chips))
    return str(path)


def chip(name="emu", count=2, memory=0.01, extra="    emulation: {relative_speed: 0.25}\n") -> str:
    return CHIP.format(name=name, count=count, memory=memory, extra=extra)


def test_an_emulation_section_makes_the_chip_emulated_with_its_settings(tmp_path):
    path = cluster_file(
        tmp_path, chip(extra="    emulation: {relative_speed: 0.25, precision: tf32, "
                       "host_accessible: true}\n"))
    (emulated, ) = load_cluster(path).chips
    assert emulated.emulated and emulated.emulation.relative_speed == 0.25
    assert host_vendor_settings(emulated) == {
        "name": "emu", "description": "emulated chip emu", "device_count": 1,
        "memory_capacity": "10000000", "relative_speed": 0.25, "host_accessible": True, "round_output_ops": [
            "diopiMm", "diopiBmm", "diopiAddmm"
        ], "round_output_mantissa_bits": 10
    }


@pytest.mark.parametrize("extra, message", [
    ("    emulation: {relative_speed: 1.5}\n", "field 'emulation.relative_speed' must be in (0, 1]"),
    ("    emulation: {relative_speed: 0.1, precision: fp8}\n", "field 'precision': must be one of"),
    ("    emulated: false\n    emulation: {relative_speed: 0.1}\n", "field 'emulated' is false"),
    ("    emulation: {speed: 0.1}\n", "unknown field 'speed'"),
])
def test_a_bad_emulation_section_is_one_line_naming_file_and_field(tmp_path, extra, message):
    path = cluster_file(tmp_path, chip(extra=extra))
    with pytest.raises(UserError, match=path) as error:
        load_cluster(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_rule_admits_speeds_summing_to_the_limit_of_the_host_cores(tmp_path):
    (emulated, ) = load_cluster(cluster_file(tmp_path, chip(count=4))).chips
    ranks = [emulated] * 4
    assert emulated.emulation.relative_speed * len(ranks) == CORE_SHARE_LIMIT * 2  # 4 x 0.25 = 0.5 x 2: the limit
    assert check_core_share(ranks, cores=2, where="c.yaml") is None  # admitted: no error


def test_the_rule_refuses_ranks_claiming_more_than_its_share_of_the_cores(tmp_path):
    (emulated, ) = load_cluster(cluster_file(tmp_path, chip(count=5))).chips
    with pytest.raises(UserError) as error:
        check_core_share([emulated] * 5, cores=2, where="c.yaml")
    assert str(error.value).startswith("c.yaml: field 'emulation.relative_speed': the 5 ranks on this host claim "
                                       "1.25 cores (5 x 0.25 (emu))")
    assert f"{CORE_SHARE_LIMIT:g} x 2 host cores = 1" in str(error.value)


def test_a_rank_of_a_chip_without_emulation_claims_a_whole_core(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, chip(), chip(name="cpu-chip", extra="")))
    with pytest.raises(UserError, match=r"claim 1.25 cores \(1 x 0.25 \(emu\) \+ 1 x 1 \(cpu-chip\)\)"):
        check_core_share([cluster.chip("emu"), cluster.chip("cpu-chip")], cores=2, where="c.yaml")


STRATEGY = {
    "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": "tiny",
    "stages": [{"chip": "emu", "tp": 2, "layers": 2}, {"chip": "cpu-chip", "tp": 1, "layers": 2}]
}


def test_ranks_take_their_stage_chip_in_rank_order(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, chip(), chip(name="cpu-chip", extra="")))
    strategy = strategy_from_mapping(STRATEGY, "s.yaml")
    assert [c.name for c in rank_chips(strategy, cluster)] == ["emu", "emu", "cpu-chip"]
    assert [c.name for c in rank_chips(strategy, cluster, range(1, 3))] == ["emu", "cpu-chip"]


def test_stages_of_emulated_chips_run_on_the_dipu_device(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, chip(), chip(name="cpu-chip", extra="")))
    strategy = emulated_stage_devices(strategy_from_mapping(STRATEGY, "s.yaml"), cluster, "s.yaml")
    assert [stage.device for stage in strategy.stages] == ["dipu", None]


def test_a_stage_naming_another_device_for_an_emulated_chip_is_refused(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, chip(), chip(name="cpu-chip", extra="")))
    data = {**STRATEGY, "stages": [{**STRATEGY["stages"][0], "device": "cpu"}, STRATEGY["stages"][1]]}
    with pytest.raises(UserError, match=r"s.yaml: field 'stages\[0\].device': chip 'emu' is emulated on the dipu"):
        emulated_stage_devices(strategy_from_mapping(data, "s.yaml"), cluster, "s.yaml")


def test_ranks_that_used_more_host_cores_than_the_rule_grants_are_warned_about():
    warning = host_work_warning(1.14, 2)
    assert "1.14 host cores" in warning and f"{CORE_SHARE_LIMIT:g} x 2" in warning


def test_ranks_inside_the_rule_get_no_warning():
    assert host_work_warning(CORE_SHARE_LIMIT * 2, 2) is None


def test_a_rank_of_an_emulated_chip_sleeps_while_it_waits_on_dicomm(tmp_path):
    # a fresh interpreter: the chip must be chosen before this process's dipu device first opens
    path = cluster_file(tmp_path, chip())
    script = (
        "import os; from h2.core.cluster import load_cluster; from heteropp.emulated_chip import open_emulated_chip; "
        f"(chip,) = load_cluster({path!r}).chips; open_emulated_chip(chip, {str(tmp_path / 'chips')!r}); "
        "print(os.environ['DICOMM_SPIN_US'])")
    environment = {name: value for name, value in os.environ.items() if name != "DICOMM_SPIN_US"}
    result = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "0", result.stderr[-2000:]
