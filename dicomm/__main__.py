"""`python -m dicomm topology`: this node's chips, NICs and the NIC each chip uses (docs/dicomm.md).
(The benchmark is `python benchmarks/dicomm/bench.py`.)"""
from __future__ import annotations

import json
import sys

from dicomm import topology
from h2.core.errors import ArgumentParser, run_cli


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="dicomm", description="DiComm tools")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("topology", help="print the chip -> NIC map from the PCI topology")
    show.add_argument("--sysfs", default="/sys", help="root of the sysfs tree to read (default /sys)")
    show.add_argument("--json", action="store_true", help="print the map as JSON")
    return parser


@run_cli("dicomm")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    found = topology.discover(args.sysfs)
    choices = topology.choose_nics(found)
    if args.json:
        print(
            json.dumps(
                {
                    "chips": [{
                        "pci": c.chip.address, "vendor": c.chip.vendor, "numa": c.chip.numa_node, "nic": c.nic.name,
                        "reason": c.reason
                    } for c in choices] or [{"pci": chip.address, "nic": None} for chip in found.chips],
                    "nics": [{"name": n.name, "pci": n.address, "numa": n.numa_node} for n in found.nics],
                }, indent=1))
    else:
        print(topology.format_map(found, choices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
