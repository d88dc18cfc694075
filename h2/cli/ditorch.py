"""The `ditorch` command.

  ditorch info            the active vendor, every adapter's probe, devices, versions and active mappings
  ditorch conformance     OpInfo samples of the DIOPI table's operators (and, with --fallback, of every
                          op_db operator) on dipu against the CPU
  ditorch compat          which torch.cuda APIs, distributed entry points and torch features work here
  ditorch precision-diff  a run's loss curve against a reference run (MRE; exit 0 pass, 1 fail)
  ditorch replay          rerun op calls saved by the capture tool on a device and compare
  ditorch run             run an unmodified CUDA script (or -m module) on this node's accelerator

Errors a user can fix are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from h2.core import flags
from h2.core.errors import ArgumentParser, UserError, run_cli


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
        description = dipu.vendor.device_description(index)
        if description:
            lines.append(f"    {description}")
    return lines


def command_info(args) -> int:
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
            raise UserError(f"--dtypes: '{name.strip()}' is not a torch dtype")
        dtypes.append(dtype)
    return tuple(dtypes)


def _saved_conformance(path: str):
    """The results and the profile's degradation of an earlier run's --json file."""
    from ditorch.dipu import conformance

    try:
        with open(path) as handle:
            saved = json.load(handle)
        results = [conformance.CheckResult.from_dict(r) for r in saved["results"]]
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path}: not a ditorch conformance --json file ({error})") from None
    degradation = conformance.profile_degradation(
        saved["profile"]) if saved.get("degrades") else conformance.Degradation()
    return saved, results, degradation


def command_conformance(args) -> int:
    baseline = _saved_conformance(args.baseline)[1] if args.baseline else None  # read before any check runs
    if args.from_json:
        from ditorch.dipu import conformance

        _check_writable(args.markdown)
        saved, results, degradation = _saved_conformance(args.from_json)
        print(f"conformance of vendor {saved['vendor']} (profile {saved['profile']}) against the CPU, "
              f"as saved in {args.from_json}: {len(results)} checks")
        return _report_conformance(args, results, degradation, saved["vendor"], saved["profile"], baseline)
    if args.profile:
        os.environ["DIPU_HOST_PROFILE"] = args.profile
    import ditorch.dipu as dipu
    if args.vendor:
        dipu.use_vendor(args.vendor)  # before the device's first use, which opens the vendor
        os.environ["DIPU_VENDOR"] = dipu.resolve_vendor(args.vendor)  # for the worker processes
    from ditorch.dipu import conformance

    if not 1 <= args.max_samples <= 10_000:
        raise UserError(f"--max-samples must be between 1 and 10000, got {args.max_samples}")
    if not 0 < args.check_timeout < float("inf"):
        raise UserError(f"--check-timeout must be a positive number of seconds, got {args.check_timeout}")
    for path in (args.json, args.markdown):
        _check_writable(path)  # before a run that can take minutes
    dtypes = _parse_dtypes(args.dtypes) if args.dtypes else conformance.DEFAULT_DTYPES
    wanted = {name.strip() for name in args.ops.split(",")} if args.ops else None
    table = dipu.diopi_table()
    checks = conformance.table_checks(table, wanted)
    if args.fallback:
        checks += conformance.fallback_checks(conformance.load_op_db(), wanted)
    if wanted is not None and not checks:
        where = "DIOPI table entry or OpInfo" if args.fallback else "DIOPI table entry"
        raise UserError(f"no {where} matches {', '.join(sorted(wanted))}")
    degradation = conformance.profile_degradation() if dipu.vendor_name() == "host" else conformance.Degradation()

    profile = f" (profile {conformance.profile_name()})" if dipu.vendor_name() == "host" else ""
    print(f"conformance of vendor {dipu.vendor_name()}{profile} against the CPU: "
          f"{len(checks)} checks, up to {args.max_samples} samples per dtype")
    results = conformance.run_isolated(checks, dtypes, args.max_samples, progress=_conformance_progress,
                                       timeout=args.check_timeout)
    return _report_conformance(args, results, degradation, dipu.vendor_name(), conformance.profile_name(), baseline)


def _tolerances(dtypes) -> str:
    """The rtol/atol torch.testing.assert_close applies to each floating dtype (exact for the others)."""
    from torch.testing._comparison import default_tolerances

    parts = []
    for dtype in dtypes:
        rtol, atol = default_tolerances(dtype)
        parts.append(f"{str(dtype).removeprefix('torch.')} " +
                     (f"rtol {rtol:g} atol {atol:g}" if rtol or atol else "exact"))
    return "; ".join(parts)


def _report_conformance(args, results, degradation, vendor: str, profile: str, baseline=None) -> int:
    from ditorch.dipu import conformance

    print(f"tolerances (torch.testing.assert_close per dtype): {_tolerances(conformance.DEFAULT_DTYPES)}")

    for result in results:
        if result.check.aten or result.status != "pass" or args.verbose:
            print(conformance.format_result(result))
    _print_conformance_summary(results, degradation, profile, baseline)
    totals = conformance.summary(results)
    if args.json:
        _write_output(
            args.json,
            json.dumps(
                {
                    "vendor": vendor, "profile": profile, "degrades": sorted(degradation.functions), "summary": totals,
                    "results": [r.to_dict() for r in results]
                }, indent=1))
    if args.markdown:
        _write_output(args.markdown, conformance.format_markdown(results, degradation))
    return 1 if totals["failed"] else 0


def _conformance_progress(done: int, total: int, result) -> None:
    if done == total or done % 50 == 0:
        print(f"[conformance] {done}/{total} checks", file=sys.stderr, flush=True)


def _print_conformance_summary(results, degradation, profile: str, baseline=None) -> None:

    table = [r for r in results if r.check.aten]
    failed = [r for r in table if r.status == "fail"]
    if table:
        print(f"summary: {len(table) - len(failed)} passed, {len(failed)} failed of {len(table)} table checks" +
              (f"; failed: {', '.join(r.check.aten for r in failed)}" if failed else ""))
    sweep = [r for r in results if not r.check.aten]
    if sweep:
        counts = {status: sum(r.status == status for r in sweep) for status in ("pass", "fail", "skip")}
        through_fallback = [r for r in sweep if "fallback" in r.path]
        print(f"op_db sweep: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} not compared "
              f"of {len(sweep)} checks; {len(through_fallback)} reached the CPU fallback, "
              f"{sum(r.status == 'pass' for r in through_fallback)} of them passed")
    if degradation.functions:
        failed_all = {r.check.label for r in results if r.status == "fail"}
        degraded = {r.check.label for r in results if r.degraded}
        against = ""
        if baseline is not None:  # checks the exact profile fails too say nothing about this profile
            failing_anyway = {r.check.label for r in baseline if r.status == "fail"}
            failed_all, degraded = failed_all - failing_anyway, degraded - failing_anyway
            against = f" (of the checks the baseline passes; it fails {len(failing_anyway)})"
        verdict = f"exactly the degraded checks fail{against}" if failed_all == degraded else (
            f"failed{against} but not degraded: {', '.join(sorted(failed_all - degraded)) or 'none'}; "
            f"degraded but passed: {', '.join(sorted(degraded - failed_all)) or 'none'}")
        print(f"profile {profile} rounds {', '.join(sorted(degradation.functions))} to "
              f"{degradation.mantissa_bits} mantissa bits: {len(degraded)} checks reach them; {verdict}")


def _check_writable(path: str | None) -> None:
    folder = os.path.dirname(os.path.abspath(path)) if path and path != "-" else None
    if folder and not os.path.isdir(folder):
        raise UserError(f"{path}: cannot write (no folder {folder})")
    if folder and not os.access(folder, os.W_OK):
        raise UserError(f"{path}: cannot write (folder {folder} is not writable)")


def _write_output(path: str, text: str) -> None:
    if path == "-":
        print(text)
        return
    try:
        with open(path, "w") as handle:
            handle.write(text + "\n")
    except OSError as error:
        raise UserError(f"{path}: cannot write ({error.strerror or error})") from None


def command_compat(args) -> int:
    import ditorch
    from ditorch import compat

    _check_writable(args.markdown)
    probes = [p for p in compat.PROBES if not args.area or p[0] in args.area.split(",")]
    if not probes:
        raise UserError(
            f"--area: no probes in '{args.area}' (areas: {', '.join(dict.fromkeys(p[0] for p in compat.PROBES))})")
    device = ditorch.info()["device_type"] or "cpu"

    def progress(done, total, result):
        print(f"[compat] {done}/{total} {result.api}: {'works' if result.works else 'fails'}", file=sys.stderr,
              flush=True)

    results = compat.run_probes(probes, progress=progress)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    else:
        for r in results:
            print(f"{'works' if r.works else 'FAILS':<6} {r.area:<12} {r.api}" +
                  (f"  ({r.detail})" if r.detail else ""))
        print(f"summary: {sum(r.works for r in results)} of {len(results)} probes work on {device}")
    if args.markdown:
        _write_output(args.markdown, compat.format_markdown(results, device))
    return 0


# ---- precision-diff ---------------------------------------------------------------------------------
def add_precision_diff_arguments(parser: argparse.ArgumentParser) -> None:
    from ditorch.precision.loss_diff import DEFAULT_THRESHOLD, DEFAULT_WINDOW
    from ditorch.precision.loss_log import FORMATS

    parser.add_argument(
        "--reference", required=True, metavar="REF",
        help="reference loss log: h2 metrics.jsonl or run folder, JSONL, CSV (W&B exports too), a "
        "Megatron-LM, torchtitan or nanoGPT log, a TensorBoard event file or run folder")
    parser.add_argument("--candidate", required=True, metavar="RUN", help="candidate loss log (same forms)")
    for role in ("reference", "candidate"):
        parser.add_argument(f"--{role}-format", choices=FORMATS, default="auto",
                            help=f"format of the {role} log (default: recognised from the file)")
        parser.add_argument(
            f"--{role}-key", metavar="NAME",
            help=f"the {role}'s loss column, field or TensorBoard tag (default: the first of loss, "
            f"lm loss, train/loss, ... it has)")
        parser.add_argument(
            f"--{role}-tokens-per-step", type=int, metavar="N",
            help=f"tokens the {role} consumes per step, for --align tokens (default: what its log says)")
    parser.add_argument("--align", choices=("step", "tokens"), default="step",
                        help="pair steps by number (default) or by consumed tokens, when the batch sizes differ")
    parser.add_argument("--threshold", type=flags.finite_float, default=DEFAULT_THRESHOLD,
                        help=f"pass when MRE < threshold (default {DEFAULT_THRESHOLD}, the H2 paper's 1.5%%)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="compare the reference's first N steps (default: all of its steps)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help=f"steps per window in the per-window table (default {DEFAULT_WINDOW})")
    parser.add_argument("--plot", metavar="PNG", help="write both curves and the relative error to this PNG")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _read_curve(args: argparse.Namespace, role: str):
    from ditorch.precision.loss_log import read_loss_log

    log = read_loss_log(getattr(args, role), getattr(args, f"{role}_format"), getattr(args, f"{role}_key"))
    tokens_per_step = getattr(args, f"{role}_tokens_per_step")
    if tokens_per_step is not None:
        if tokens_per_step < 1:
            raise UserError(f"--{role}-tokens-per-step must be at least 1, got {tokens_per_step}")
        log = log.with_tokens_per_step(tokens_per_step)
    return log


@run_cli("ditorch precision-diff")
def command_precision_diff(args: argparse.Namespace) -> int:
    from ditorch.precision.loss_diff import compare_losses, format_report

    reference, candidate = _read_curve(args, "reference"), _read_curve(args, "candidate")
    diff = compare_losses(reference, candidate, threshold=args.threshold, steps=args.steps, window=args.window,
                          align=args.align)
    if args.plot:
        from ditorch.precision.plot import plot_loss_diff
        plot_loss_diff(diff, args.plot, reference_label=reference.path, candidate_label=candidate.path)
    if args.json:
        print(
            json.dumps({
                "reference": reference.path, "candidate": candidate.path, "reference_format": reference.format,
                "candidate_format": candidate.format, **diff.to_dict(), "plot": args.plot
            }))
    else:
        print(format_report(diff, reference.path, candidate.path, reference.format, candidate.format))
        if args.plot:
            print(f"plot {args.plot}")
    return 0 if diff.passed else 1


def add_precision_diff_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "precision-diff", help="compare a loss curve with a reference run (the H2 paper's MRE criterion)",
        description="Compare a candidate run's loss curve with a reference run's. Exit 0 when the mean "
        "relative error is below the threshold, 1 when it is not, 2 on bad input.")
    add_precision_diff_arguments(parser)
    parser.set_defaults(run=command_precision_diff)
    return parser


# ---- replay -----------------------------------------------------------------------------------------
@run_cli("ditorch replay")
def command_replay(args: argparse.Namespace) -> int:
    from ditorch.op_tools.replay import run_replay

    return run_replay(args.capture, args.device, rtol=args.rtol, atol=args.atol)


def add_replay_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "replay", help="rerun op calls saved by the capture tool on a device and compare the outputs",
        description="Rerun op calls saved by the capture tool (ditorch.op_tools.OpCapture) and compare "
        "with the saved outputs. Exit 0 when all match, 1 when some do not, 2 on bad input.")
    parser.add_argument("capture", metavar="DIR", help="a capture folder (or one call folder inside it)")
    parser.add_argument("--device", default="cpu", help="device to replay on (default cpu)")
    parser.add_argument("--rtol", type=flags.finite_float,
                        help="relative tolerance for all outputs (default: per dtype)")
    parser.add_argument("--atol", type=flags.finite_float,
                        help="absolute tolerance for all outputs (default: per dtype)")
    parser.set_defaults(run=command_replay)
    return parser


# ---- run ------------------------------------------------------------------------------------------
def command_run(args: argparse.Namespace) -> int:
    from ditorch.op_tools.run import run_program

    return run_program(args.program, "ditorch run", warn_without_tools=False)


def add_run_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run", help="run an unmodified CUDA-written script on this node's accelerator (as python -m ditorch)",
        description="Run script.py (or -m module) with its arguments as if its first line were `import "
        "ditorch`; Python processes it starts (torchrun workers, spawned children) import ditorch "
        "too. DITORCH_* variables switch op tools on.")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="script.py|-m module [args]")
    parser.set_defaults(run=command_run)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ditorch", description="DiTorch device tools")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    info = commands.add_parser("info", help="vendor, devices, versions and active CUDA mappings")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(run=command_info)
    conformance = commands.add_parser("conformance", help="check DIOPI kernels against the CPU with OpInfo samples")
    conformance.add_argument("--vendor", help="vendor name or library path (default: DIPU_VENDOR or host)")
    conformance.add_argument("--profile", help="host vendor emulation profile: built-in name or YAML path")
    conformance.add_argument("--ops", help="comma-separated ATen or OpInfo names (default: the whole table)")
    conformance.add_argument("--dtypes",
                             help="comma-separated dtypes (default: float32,float64,bfloat16,float16,int64,bool)")
    conformance.add_argument("--max-samples", type=int, default=16, help="samples per operator and dtype")
    conformance.add_argument(
        "--fallback", action="store_true",
        help="also sweep every OpInfo of torch's op_db (forward and backward), which covers "
        "the ops that run through the CPU fallback")
    conformance.add_argument("--json", metavar="FILE", help="write every result and the summary as JSON ('-': stdout)")
    conformance.add_argument("--markdown", metavar="FILE", help="write the summary tables as Markdown ('-': stdout)")
    conformance.add_argument("--verbose", action="store_true", help="print passing op_db checks too")
    conformance.add_argument(
        "--baseline", metavar="FILE",
        help="an exact profile's --json: the profile's verdict leaves out the checks that fail there too")
    conformance.add_argument("--from-json", metavar="FILE",
                             help="report the results an earlier run saved with --json, without running anything")
    conformance.add_argument("--check-timeout", type=float, default=600.0, metavar="SECONDS",
                             help="a check running longer fails and the sweep goes on (default 600)")
    conformance.set_defaults(run=command_conformance)
    compat = commands.add_parser(
        "compat", help="which torch.cuda APIs, distributed entry points and torch features "
        "a CUDA script can use here after `import ditorch`")
    compat.add_argument("--area", help="comma-separated areas to probe (default: all)")
    compat.add_argument("--json", action="store_true", help="print the results as JSON")
    compat.add_argument("--markdown", metavar="FILE", help="write the results as a Markdown table ('-': stdout)")
    compat.set_defaults(run=command_compat)
    add_precision_diff_parser(commands)
    add_replay_parser(commands)
    add_run_parser(commands)
    return parser


@run_cli("ditorch", also=(RuntimeError, ))  # vendor and profile failures surface as RuntimeError
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
