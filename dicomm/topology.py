"""Which NIC each chip of this node should use, from the PCI topology in sysfs.

Discovery reads `<sysfs>/bus/pci/devices`: every accelerator (PCI class 0x0300 display, 0x0302 3D
controller, 0x0b40 co-processor, 0x1200 processing accelerator) is a chip, every RDMA device under
`<sysfs>/class/infiniband` (or, with none, every PCI network interface under `<sysfs>/class/net`) is a
NIC. A device's resolved sysfs path lists the PCI bridges above it: the first is the root port, the
ones below it are PCIe switch ports, so two devices whose paths share a bridge below the root port sit
under the same switch (the deeper the shared bridge, the closer). `numa_node` gives the NUMA node.

The choice (the H2 paper's NIC affinity, Table 3): chips that share a PCIe switch with a NIC take the
closest such NIC first; the others take a NIC on their own NUMA node; the rest any NIC. Within each
step a chip takes the least loaded candidate (fewest chips so far; ties by NIC name), so chips spread
over the NICs they are equally close to. DICOMM_NIC overrides it: one NIC name for every chip
(`mlx5_2`), or per chip index (`0:mlx5_0,1:mlx5_3`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from h2.core.errors import UserError

CHIP_CLASSES = ("0x0300", "0x0302", "0x0b40", "0x1200")
NETWORK_CLASS = "0x0200"
OVERRIDE_VARIABLE = "DICOMM_NIC"
PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True)
class PciDevice:
    name: str  # a chip's PCI address, or a NIC's name (mlx5_0, eth0)
    address: str  # PCI address, e.g. 0000:1b:00.0
    vendor: str  # PCI vendor id, e.g. 0x10de
    numa_node: int  # -1 when the firmware does not say
    bridges: tuple[str, ...]  # PCI bridges from the root port down to the device (excluded)

    def shared_switch_depth(self, other: "PciDevice") -> int:
        """How many switch ports (bridges below the root port) the two devices share; 0: none."""
        if not self.bridges or not other.bridges or self.bridges[0] != other.bridges[0]:
            return 0
        depth = 0
        for mine, theirs in zip(self.bridges[1:], other.bridges[1:]):
            if mine != theirs:
                break
            depth += 1
        return depth


@dataclass(frozen=True)
class Choice:
    chip: PciDevice
    nic: PciDevice
    reason: str  # "override", "same PCIe switch", "same NUMA node", "least loaded"


@dataclass
class Topology:
    chips: list[PciDevice] = field(default_factory=list)
    nics: list[PciDevice] = field(default_factory=list)


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _pci_device(sysfs: str, address: str, name: str) -> PciDevice:
    device_dir = os.path.join(sysfs, "bus", "pci", "devices", address)
    resolved = os.path.realpath(device_dir)
    parts = resolved.split(os.sep)
    # .../devices/pci0000:00/<root port>/<switch up>/<switch down>/<device>
    roots = [i for i, part in enumerate(parts) if part.startswith("pci")]
    bridges = tuple(parts[roots[-1] + 1:-1]) if roots else ()
    numa = _read(os.path.join(device_dir, "numa_node"), "-1")
    return PciDevice(name=name, address=address, vendor=_read(os.path.join(device_dir, "vendor")),
                     numa_node=int(numa) if numa.lstrip("-").isdigit() else -1, bridges=bridges)


def _nic_addresses(sysfs: str) -> list[tuple[str, str]]:
    """(NIC name, PCI address) of RDMA devices, or of PCI network interfaces when there are none."""
    for folder in ("infiniband", "net"):
        found = []
        class_dir = os.path.join(sysfs, "class", folder)
        for name in sorted(os.listdir(class_dir)) if os.path.isdir(class_dir) else []:
            device = os.path.join(class_dir, name, "device")
            if not os.path.exists(device):
                continue  # virtual interface (lo, bridges)
            # The PCI function itself, or the one above a bus of its own (virtio2 under 0000:00:03.0).
            address = next(
                (part
                 for part in reversed(os.path.realpath(device).split(os.sep)) if PCI_ADDRESS.fullmatch(part)), None)
            pci_class = _read(os.path.join(sysfs, "bus", "pci", "devices", address or "-", "class"))
            if address is None or (folder == "net" and not pci_class.startswith(NETWORK_CLASS)):
                continue
            found.append((name, address))
        if found:
            return found
    return []


def discover(sysfs: str = "/sys") -> Topology:
    """Chips and NICs of this node (or of the sysfs tree rooted at `sysfs`), in PCI address order."""
    pci_dir = os.path.join(sysfs, "bus", "pci", "devices")
    if not os.path.isdir(pci_dir):
        raise UserError(f"{pci_dir}: no PCI devices listed (is {sysfs} a sysfs tree?)")
    topology = Topology()
    for address in sorted(os.listdir(pci_dir)):
        if _read(os.path.join(pci_dir, address, "class")).startswith(CHIP_CLASSES):
            topology.chips.append(_pci_device(sysfs, address, address))
    topology.nics = [_pci_device(sysfs, address, name) for name, address in _nic_addresses(sysfs)]
    return topology


def _parse_override(text: str, topology: Topology) -> dict[int, PciDevice]:
    by_name = {nic.name: nic for nic in topology.nics}

    def nic_named(name: str) -> PciDevice:
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise UserError(f"{OVERRIDE_VARIABLE}={text}: no NIC named '{name}' on this node (NICs: {known})")
        return by_name[name]

    if ":" not in text:
        nic = nic_named(text.strip())
        return {index: nic for index in range(len(topology.chips))}
    chosen = {}
    for item in text.split(","):
        index, _, name = item.partition(":")
        if not index.strip().isdigit() or int(index) >= len(topology.chips):
            raise UserError(f"{OVERRIDE_VARIABLE}={text}: '{item}' does not name a chip index below "
                            f"{len(topology.chips)} and a NIC (expected CHIP:NIC,...)")
        chosen[int(index)] = nic_named(name.strip())
    return chosen


def choose_nics(topology: Topology, override: str | None = None) -> list[Choice]:
    """One NIC per chip, in chip order (see the module docstring for the rule)."""
    if not topology.nics:
        return []
    if override is None:
        override = os.environ.get(OVERRIDE_VARIABLE, "")
    forced = _parse_override(override, topology) if override.strip() else {}
    load = {nic.name: 0 for nic in topology.nics}
    choices: dict[int, Choice] = {}

    def take(index: int, candidates: list[PciDevice], reason: str) -> None:
        nic = min(candidates, key=lambda n: (load[n.name], n.name))
        load[nic.name] += 1
        choices[index] = Choice(topology.chips[index], nic, reason)

    for index, nic in forced.items():
        load[nic.name] += 1
        choices[index] = Choice(topology.chips[index], nic, "override")
    for index, chip in enumerate(topology.chips):
        depths = {nic.name: chip.shared_switch_depth(nic) for nic in topology.nics}
        closest = max(depths.values())
        if index not in choices and closest > 0:
            take(index, [nic for nic in topology.nics if depths[nic.name] == closest], "same PCIe switch")
    for index, chip in enumerate(topology.chips):
        same_node = [nic for nic in topology.nics if nic.numa_node == chip.numa_node and chip.numa_node >= 0]
        if index not in choices and same_node:
            take(index, same_node, "same NUMA node")
    for index in range(len(topology.chips)):
        if index not in choices:
            take(index, topology.nics, "least loaded")
    return [choices[index] for index in range(len(topology.chips))]


def format_map(topology: Topology, choices: list[Choice]) -> str:
    """The map as `dicomm topology` prints it."""
    lines = [f"{len(topology.chips)} chip(s), {len(topology.nics)} NIC(s)"]
    for nic in topology.nics:
        lines.append(f"nic {nic.name:<10} pci {nic.address}  numa {nic.numa_node:>2}  switch path "
                     f"{'/'.join(nic.bridges) or '-'}")
    for index, choice in enumerate(choices):
        chip = choice.chip
        lines.append(f"chip {index:<3} pci {chip.address}  vendor {chip.vendor or '?':<6}  numa {chip.numa_node:>2}  "
                     f"-> {choice.nic.name} ({choice.reason})")
    if topology.chips and not topology.nics:
        lines.append("no NIC found: chips talk through the host's network stack (tcp)")
    return "\n".join(lines)
