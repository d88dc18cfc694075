"""Subcommands of the `ditorch` command line owned by the precision tools:
`precision-diff` (loss curve against a reference) and `replay` (rerun captured op calls).

Each `add_*_parser(subparsers)` adds one subcommand; `args.run(args)` (also stored as
`args.handler`) returns the exit code, printing user errors as one line and returning 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from ditorch.precision.loss_diff import DEFAULT_THRESHOLD, DEFAULT_WINDOW


def add_precision_diff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", required=True, metavar="REF",
                        help="reference loss log: metrics.jsonl, a run folder holding one, or a CSV of step,loss")
    parser.add_argument("--candidate", required=True, metavar="RUN", help="candidate loss log (same forms)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help=f"pass when MRE < threshold (default {DEFAULT_THRESHOLD}, the H2 paper's 1.5%%)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="compare the reference's first N steps (default: all of its steps)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help=f"steps per window in the per-window table (default {DEFAULT_WINDOW})")
    parser.add_argument("--plot", metavar="PNG", help="write both curves and the relative error to this PNG")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run_precision_diff)


def run_precision_diff(args: argparse.Namespace) -> int:
    from ditorch.precision.loss_diff import compare_losses, format_report
    from ditorch.precision.loss_log import read_loss_log

    reference = read_loss_log(args.reference)
    candidate = read_loss_log(args.candidate)
    diff = compare_losses(reference, candidate, threshold=args.threshold, steps=args.steps, window=args.window)
    if args.plot:
        from ditorch.precision.plot import plot_loss_diff
        plot_loss_diff(diff, args.plot, reference_label=reference.path, candidate_label=candidate.path)
    if args.json:
        print(json.dumps({"reference": reference.path, "candidate": candidate.path, **diff.to_dict(),
                          "plot": args.plot}))
    else:
        print(format_report(diff, reference.path, candidate.path))
        if args.plot:
            print(f"plot {args.plot}")
    return 0 if diff.passed else 1


def _one_line_errors(prog: str, handler):
    """The handler, with a UserError printed as `prog: error: message` and turned into exit status 2."""
    from ditorch.op_tools.errors import UserError

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UserError as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            return 2

    return run


def add_precision_diff_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "precision-diff", help="compare a loss curve with a reference run (the H2 paper's MRE criterion)",
        description="Compare a candidate run's loss curve with a reference run's. Exit 0 when the mean "
                    "relative error is below the threshold, 1 when it is not, 2 on bad input.")
    add_precision_diff_arguments(parser)
    run = _one_line_errors("ditorch precision-diff", run_precision_diff)
    parser.set_defaults(run=run, handler=run)
    return parser


def add_replay_parser(subparsers) -> argparse.ArgumentParser:
    from ditorch.op_tools.replay import add_replay_arguments, run_replay

    parser = subparsers.add_parser(
        "replay", help="rerun op calls saved by the capture tool on a device and compare the outputs",
        description="Rerun op calls saved by the capture tool (ditorch.op_tools.OpCapture) and compare "
                    "with the saved outputs. Exit 0 when all match, 1 when some do not, 2 on bad input.")
    add_replay_arguments(parser)
    run = _one_line_errors("ditorch replay", run_replay)
    parser.set_defaults(run=run, handler=run)
    return parser
