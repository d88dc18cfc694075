"""Fake sysfs trees shaped like real servers, for NIC affinity tests: PCI devices under root ports
and PCIe switches (/sys/devices/pci...), their bus/pci/devices links, and class/infiniband links."""
from __future__ import annotations

import os

GPU_CLASS = "0x030200"  # 3D controller (datacenter GPU)
ACCELERATOR_CLASS = "0x120000"  # processing accelerator
NIC_CLASS = "0x020700"  # InfiniBand controller
ETHERNET_CLASS = "0x020000"


class FakeSysfs:

    def __init__(self, root: str):
        self.root = root

    def add(self, bridges: list[str], address: str, pci_class: str, numa_node: int, vendor: str = "0x10de",
            infiniband: str | None = None, net: str | None = None) -> None:
        """A device at `address` below `bridges` (root bus first, e.g. ["pci0000:00", "0000:00:01.0", ...])."""
        device = os.path.join(self.root, "devices", *bridges, address)
        os.makedirs(device, exist_ok=True)
        for name, value in (("class", pci_class), ("vendor", vendor), ("numa_node", str(numa_node))):
            with open(os.path.join(device, name), "w") as f:
                f.write(value + "\n")
        self.link(os.path.join("bus", "pci", "devices", address), device)
        for folder, name in (("infiniband", infiniband), ("net", net)):
            if name:
                self.link(os.path.join("class", folder, name, "device"), device)

    def link(self, relative: str, target: str) -> None:
        """A symlink at `relative` (below the root) to `target`."""
        link = os.path.join(self.root, relative)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def switch_path(root_bus: int, downstream: int) -> list[str]:
    """Root complex `root_bus`, its root port, a PCIe switch's upstream and `downstream` port."""
    return [
        f"pci0000:{root_bus:02x}", f"0000:{root_bus:02x}:01.0", f"0000:{root_bus + 1:02x}:00.0",
        f"0000:{root_bus + 2:02x}:{downstream:02x}.0"
    ]


def eight_gpu_eight_nic_node(root: str) -> FakeSysfs:
    """A DGX-A100-like node: four PCIe switches (two per NUMA node), each with two GPUs and two
    RDMA NICs; GPUs 2k, 2k+1 and NICs mlx5_2k, mlx5_2k+1 share switch k."""
    tree = FakeSysfs(root)
    for k in range(4):
        bus = 0x40 * k
        numa = k // 2
        for slot in range(4):
            address = f"0000:{bus + 3 + slot:02x}:00.0"
            if slot < 2:
                tree.add(switch_path(bus, slot), address, GPU_CLASS, numa)
            else:
                tree.add(switch_path(bus, slot), address, NIC_CLASS, numa, vendor="0x15b3",
                         infiniband=f"mlx5_{2 * k + slot - 2}")
    return tree


def sixteen_chip_four_nic_node(root: str) -> FakeSysfs:
    """Sixteen accelerators in pairs under eight PCIe switches (switches 0-3 on NUMA node 0, 4-7 on
    node 1); the four NICs sit under switches 0, 2, 4 and 6 (mlx5_0 .. mlx5_3)."""
    tree = FakeSysfs(root)
    for s in range(8):
        bus = 0x20 * s
        numa = s // 4
        for slot in range(2):
            tree.add(switch_path(bus, slot), f"0000:{bus + 3 + slot:02x}:00.0", ACCELERATOR_CLASS, numa,
                     vendor="0x1e3e")
        if s % 2 == 0:
            tree.add(switch_path(bus, 2), f"0000:{bus + 5:02x}:00.0", NIC_CLASS, numa, vendor="0x15b3",
                     infiniband=f"mlx5_{s // 2}")
    return tree
