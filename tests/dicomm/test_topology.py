"""NIC affinity: discovery from sysfs trees shaped like real servers, the per-chip NIC choice against
hand-worked maps, the DICOMM_NIC override, and `python -m dicomm topology`."""
import pytest

from dicomm import topology
from fake_sysfs import (
    ETHERNET_CLASS,
    GPU_CLASS,
    FakeSysfs,
    eight_gpu_eight_nic_node,
    sixteen_chip_four_nic_node,
    switch_path,
)
from h2.core.errors import UserError


def nic_map(root, override=""):
    return [choice.nic.name for choice in topology.choose_nics(topology.discover(str(root)), override)]


def test_discovery_finds_the_chips_nics_and_numa_nodes_of_an_eight_gpu_node(tmp_path):
    eight_gpu_eight_nic_node(tmp_path)
    found = topology.discover(str(tmp_path))
    assert [chip.numa_node for chip in found.chips] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [nic.name for nic in found.nics] == [f"mlx5_{i}" for i in range(8)]


def test_on_an_eight_gpu_eight_nic_node_each_gpu_takes_its_own_nic_on_its_switch(tmp_path):
    eight_gpu_eight_nic_node(tmp_path)
    assert nic_map(tmp_path) == [f"mlx5_{i}" for i in range(8)]


def test_on_a_sixteen_chip_four_nic_node_chips_use_their_switch_nic_then_spread_over_their_numa_node(tmp_path):
    sixteen_chip_four_nic_node(tmp_path)
    # Pass 1, same switch: chips 0,1 -> mlx5_0; 4,5 -> mlx5_1; 8,9 -> mlx5_2; 12,13 -> mlx5_3 (2 each).
    # Pass 2, same NUMA node, least loaded (ties by name): 2 -> mlx5_0, 3 -> mlx5_1, 6 -> mlx5_0,
    # 7 -> mlx5_1 on node 0; 10 -> mlx5_2, 11 -> mlx5_3, 14 -> mlx5_2, 15 -> mlx5_3 on node 1.
    expected = [0, 0, 0, 1, 1, 1, 0, 1, 2, 2, 2, 3, 3, 3, 2, 3]
    assert nic_map(tmp_path) == [f"mlx5_{n}" for n in expected]


def test_the_reason_for_each_choice_is_reported(tmp_path):
    sixteen_chip_four_nic_node(tmp_path)
    reasons = [c.reason for c in topology.choose_nics(topology.discover(str(tmp_path)), "")]
    assert reasons[:4] == ["same PCIe switch", "same PCIe switch", "same NUMA node", "same NUMA node"]


def test_without_numa_or_switch_affinity_chips_spread_over_the_least_loaded_nics(tmp_path):
    tree = FakeSysfs(tmp_path)
    for i in range(4):
        tree.add(switch_path(0x10 * i, 0), f"0000:{0x10 * i + 3:02x}:00.0", GPU_CLASS, -1)
    tree.add(["pci0000:80", "0000:80:01.0"], "0000:81:00.0", ETHERNET_CLASS, -1, net="eth0")
    tree.add(["pci0000:90", "0000:90:01.0"], "0000:91:00.0", ETHERNET_CLASS, -1, net="eth1")
    assert nic_map(tmp_path) == ["eth0", "eth1", "eth0", "eth1"]


def test_dicomm_nic_naming_one_nic_sends_every_chip_through_it(tmp_path):
    eight_gpu_eight_nic_node(tmp_path)
    assert nic_map(tmp_path, "mlx5_5") == ["mlx5_5"] * 8


def test_dicomm_nic_per_chip_overrides_only_the_chips_it_names(tmp_path):
    eight_gpu_eight_nic_node(tmp_path)
    # Chip 1 keeps its switch (mlx5_0, mlx5_1 both idle: mlx5_0 by name); chip 2 takes mlx5_2 on its own.
    assert nic_map(tmp_path, "0:mlx5_7,3:mlx5_7")[:4] == ["mlx5_7", "mlx5_0", "mlx5_2", "mlx5_7"]


def test_dicomm_nic_naming_an_absent_nic_is_one_line_naming_the_variable(tmp_path):
    eight_gpu_eight_nic_node(tmp_path)
    with pytest.raises(UserError, match=r"DICOMM_NIC=mlx9_0: no NIC named 'mlx9_0' on this node"):
        nic_map(tmp_path, "mlx9_0")


def test_dicomm_topology_prints_the_map(tmp_path, cli):
    sixteen_chip_four_nic_node(tmp_path)
    result = cli("dicomm", "topology", "--sysfs", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "16 chip(s), 4 NIC(s)"
    assert "chip 2   pci 0000:23:00.0  vendor 0x1e3e  numa  0  -> mlx5_0 (same NUMA node)" in result.stdout


def test_dicomm_topology_with_a_bad_override_exits_2_with_one_line(tmp_path, cli):
    eight_gpu_eight_nic_node(tmp_path)
    result = cli("dicomm", "topology", "--sysfs", str(tmp_path), env={"DICOMM_NIC": "9:mlx5_0"})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "DICOMM_NIC=9:mlx5_0" in result.stderr


def test_a_network_interface_behind_a_virtio_device_is_found_at_its_pci_function(tmp_path):
    tree = FakeSysfs(tmp_path)
    tree.add(["pci0000:00"], "0000:00:03.0", ETHERNET_CLASS, -1)
    virtio = tmp_path / "devices" / "pci0000:00" / "0000:00:03.0" / "virtio2"
    virtio.mkdir()
    tree.link("class/net/eth0/device", str(virtio))
    assert [(nic.name, nic.address) for nic in topology.discover(str(tmp_path)).nics] == [("eth0", "0000:00:03.0")]
