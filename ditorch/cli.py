"""The `ditorch` command.

  ditorch info          the active vendor, every adapter's probe, devices, versions and active mappings
  ditorch conformance   OpInfo samples of the DIOPI table's operators on dipu against the CPU
  ditorch precision-diff  a run's loss curve against a reference run (MRE; exit 0 pass, 1 fail)
  ditorch replay        rerun op calls saved by the capture tool on a device and compare

Errors a user can fix are one line on stderr and exit status 2.
"""
import argparse
import os
import sys


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _dipu_lines() -> list[str]:
    import torch

    import ditorch.dipu as dipu

    lines = [f"dipu: vendor {dipu.vendor_name()} ({dipu._C._vendor_path()}), {torch.dipu.device_count()} device(s)"]
    for index in range(torch.dipu.device_count()):
        p = torch.dipu.get_device_properties(index)
        access = "host-accessible" if p.host_accessible else "not host-accessible"
        lines.append(f"  dipu:{index} {p.name}: {_gib(p.total_memory)}, {access}, relative speed {p.relative_speed:g}")
    return lines


def command_info(args) -> int:
    import json

    import ditorch

    report = ditorch.info()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"torch {report['torch']}")
    if report["disabled"]:
        print(f"ditorch: disabled ({report['disabled']})")
    vendor = report["vendor"]
    print(f"vendor: {vendor} ({report['vendor_label']})" if vendor else "vendor: none found (plain CPU torch)")
    print("adapters (in detection order):")
    for name, probe in report["adapters"].items():
        if not probe["available"]:
            state = probe["reason"]
        elif probe["device_count"]:
            state = f"available, {probe['device_count']} device(s)"
        else:
            state = probe["reason"]
        print(f"  {name:<5} {probe['label']}: {state}")
    if vendor == "dipu":
        try:
            for line in _dipu_lines():
                print(line)
        except Exception as exc:  # the vendor may fail to load; info still reports the rest
            print(f"dipu: not loadable ({str(exc).splitlines()[0]})")
    else:
        for device in report["devices"]:
            print(f"  {device['device']} {device.get('name', '')}")
    mappings = report["mappings"]
    if report["cuda_mapped"]:
        surface = mappings["torch.cuda"]
        unsupported = [name for name, source in surface.items() if source == "unsupported"]
        print(f"mapped onto {report['device_type']}: {len(surface) - len(unsupported)} torch.cuda names"
              f"{' (unsupported: ' + ', '.join(unsupported) + ')' if unsupported else ''}; "
              f"device arguments in {len(mappings['device_arguments'])} entry points; "
              f"backend nccl -> {mappings['distributed_backend_for_nccl']}")
    elif vendor == "cuda":
        print("CUDA is native: nothing is mapped")
    return 0


def _parse_dtypes(text: str):
    import torch

    dtypes = []
    for name in text.split(","):
        dtype = getattr(torch, name.strip(), None)
        if not isinstance(dtype, torch.dtype):
            raise UsageError(f"--dtypes: '{name.strip()}' is not a torch dtype")
        dtypes.append(dtype)
    return tuple(dtypes)


def command_conformance(args) -> int:
    if args.profile:
        os.environ["DIPU_HOST_PROFILE"] = args.profile
    import ditorch.dipu as dipu
    if args.vendor:
        dipu.use_vendor(args.vendor)  # before the device's first use, which opens the vendor
    from ditorch.dipu import conformance

    dtypes = _parse_dtypes(args.dtypes) if args.dtypes else conformance.DEFAULT_DTYPES
    ops = [name.strip() for name in args.ops.split(",")] if args.ops else None

    print(f"conformance of vendor {dipu.vendor_name()} (profile {conformance.profile_name()}) against the CPU")
    results = conformance.run_conformance(ops=ops, dtypes=dtypes, max_samples=args.max_samples)
    for result in results:
        print(conformance.format_result(result))
    failed = [r for r in results if not r.passed]
    print(f"summary: {len(results) - len(failed)} passed, {len(failed)} failed of {len(results)} table entries"
          + (f"; failed: {', '.join(r.entry.aten for r in failed)}" if failed else ""))
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ditorch", description="DiTorch device tools")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    info = commands.add_parser("info", help="vendor, devices, versions and active CUDA mappings")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(run=command_info)
    conformance = commands.add_parser("conformance", help="check DIOPI kernels against the CPU with OpInfo samples")
    conformance.add_argument("--vendor", help="vendor name or library path (default: DIPU_VENDOR or host)")
    conformance.add_argument("--profile", help="host vendor emulation profile: built-in name or YAML path")
    conformance.add_argument("--ops", help="comma-separated ATen or OpInfo names (default: the whole table)")
    conformance.add_argument("--dtypes", help="comma-separated dtypes (default: float32,float64,bfloat16,float16,int64,bool)")
    conformance.add_argument("--max-samples", type=int, default=16, help="samples per operator and dtype")
    conformance.set_defaults(run=command_conformance)
    from ditorch.precision.cli import add_precision_diff_parser, add_replay_parser
    add_precision_diff_parser(commands)
    add_replay_parser(commands)
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except UsageError as exc:
        print(f"ditorch: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # DipuError and vendor/profile failures surface as RuntimeError
        print(f"ditorch: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
