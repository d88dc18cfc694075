"""The shape of the H2 paper's Table 1, reproduced by EMULATION on one CPU machine.

The reference (standing in for the paper's NVIDIA A100) is the h2 `small` preset trained on the
CPU in float32. Each "chip" is the dipu device's host vendor under an emulation profile that rounds
the outputs of some DIOPI kernels to fewer mantissa bits. For each profile: the MRE of its loss
curve against the reference (`ditorch precision-diff`), and the ops that autocompare flags in one
training step of the tiny model on that profile.

    python benchmarks/precision_table1.py --steps 80 --out runs/table1 [--update-doc docs/precision.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATMUL = ["diopiMm", "diopiBmm", "diopiAddmm"]
ATTENTION = ["diopiFlashAttention", "diopiFlashAttentionBackward"]

# name -> (what the emulated chip does differently, DIOPI functions rounded, mantissa bits kept)
PROFILES = {
    "emu-A": ("matmul outputs rounded to 10 mantissa bits (TF32-like)", MATMUL, 10),
    "emu-B": ("matmul outputs rounded to 7 mantissa bits (bfloat16-like)", MATMUL, 7),
    "emu-C": ("matmul and attention outputs rounded to 7 mantissa bits", MATMUL + ATTENTION, 7),
    "emu-D": ("matmul outputs rounded to 4 mantissa bits", MATMUL, 4),
}
CONTROL = ("emu-exact", "no rounding (the default host profile): must match the reference exactly", [], 23)

BEGIN, END = "<!-- table1:begin -->", "<!-- table1:end -->"


def write_profile(folder: str, name: str, description: str, ops: list[str], bits: int) -> str:
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w") as handle:
        handle.write(f"# Emulated chip for the Table 1 reproduction (benchmarks/precision_table1.py)\n"
                     f"name: {name}\ndescription: {description}\ndevice_count: 1\nmemory_capacity: 16GiB\n"
                     f"relative_speed: 1.0\nhost_accessible: true\n")
        if ops:
            handle.write(f"round_output_ops: [{', '.join(ops)}]\nround_output_mantissa_bits: {bits}\n")
    return path


def finished(out_dir: str, steps: int) -> bool:
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return False
    with open(path) as handle:
        return sum(1 for line in handle if line.strip()) == steps


def train(out_dir: str, args, device: str, profile: str | None) -> float:
    if args.reuse and finished(out_dir, args.steps):
        return 0.0
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if profile:
        env["DIPU_HOST_PROFILE"] = profile
    command = [
        sys.executable, "-m", "h2", "train", "--preset", args.preset, "--steps",
        str(args.steps), "--seq-len",
        str(args.seq_len), "--micro-batch-size",
        str(args.micro_batch_size), "--device", device, "--out", out_dir, "--overwrite", "--quiet",
        "--checkpoint-every", "0"
    ]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"training failed ({' '.join(command)}):\n{result.stderr[-2000:]}")
    return time.perf_counter() - started


def autocompare_worker() -> None:
    """One training step of the tiny model on dipu under autocompare; prints the flagged ops as JSON."""
    import torch

    import ditorch.dipu  # noqa: F401  registers the device
    from ditorch.op_tools import OpAutoCompare
    from h2.core.model_config import preset
    from h2.model.transformer import Transformer, language_model_loss

    torch.manual_seed(0)
    model = Transformer(preset("tiny")).to("dipu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (4, 33)).to("dipu")
    with OpAutoCompare(report=None) as tool:
        loss = language_model_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        optimizer.step()
    flagged = sorted({f"{row['op']} ({row['phase']})" for row in tool.mismatches})
    first = tool.first_mismatch
    print(
        json.dumps({
            "compared": len(tool.rows), "flagged": flagged,
            "first": f"{first['op']} in {first['module']}" if first else None
        }))


def autocompare_profile(profile: str) -> dict:
    env = {**os.environ, "DIPU_HOST_PROFILE": profile, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--autocompare-worker"], cwd=REPO, env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"autocompare worker failed for {profile}:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="Emulated reproduction of the H2 paper's Table 1")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every training run")
    parser.add_argument("--out", default="runs/table1")
    parser.add_argument("--early-steps", type=int, default=20,
                        help="also report the MRE of the first N steps (before the trajectories separate)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep runs already in --out that have all their steps (same settings assumed)")
    parser.add_argument("--update-doc", metavar="MD", help="replace the table between the table1 markers of this file")
    parser.add_argument("--autocompare-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.autocompare_worker:
        autocompare_worker()
        return

    from ditorch.precision.loss_diff import compare_losses
    from ditorch.precision.loss_log import read_loss_log
    from ditorch.precision.plot import plot_loss_diff

    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "profiles"), exist_ok=True)
    reference_dir = os.path.join(out, "reference-cpu-fp32")
    seconds = train(reference_dir, args, "cpu", None)
    print(
        f"reference: {args.preset} on cpu fp32, {args.steps} steps "
        f"({seconds:.0f} s{', reused' if not seconds else ''})", flush=True)
    reference = read_loss_log(reference_dir)
    rows = []
    for name, (description, ops, bits) in [(CONTROL[0], CONTROL[1:]), *PROFILES.items()]:
        profile = write_profile(os.path.join(out, "profiles"), name, description, ops, bits)
        run_dir = os.path.join(out, name)
        seconds = train(run_dir, args, "dipu", profile)
        candidate = read_loss_log(run_dir)
        diff = compare_losses(reference, candidate)
        early = compare_losses(reference, candidate, steps=min(args.early_steps, args.steps))
        plot_loss_diff(diff, os.path.join(out, f"{name}.png"), reference_label="cpu fp32",
                       candidate_label=f"dipu {name} (emulated)")
        flagged = autocompare_profile(profile)
        rows.append((name, description, diff, early, flagged))
        print(
            f"{name}: MRE {100 * diff.mre:.4f}% max {100 * diff.max_relative_error:.4f}% "
            f"first {len(early.steps)} steps {100 * early.mre:.4f}% ({seconds:.0f} s); "
            f"autocompare flags {', '.join(flagged['flagged']) or 'nothing'}", flush=True)

    header = (f"Emulation on one CPU machine: h2 `{args.preset}` preset, {args.steps} steps, "
              f"micro-batch {args.micro_batch_size} x {args.seq_len} tokens, reference = CPU float32; "
              f"chips = dipu host vendor under the profiles below. Command: `python benchmarks/precision_table1.py "
              f"--steps {args.steps} --preset {args.preset} --seq-len {args.seq_len} "
              f"--micro-batch-size {args.micro_batch_size} --threads {args.threads}`.")
    table = [
        header, "", f"| emulated chip | what the profile changes | MRE ({args.steps} steps) | max rel. error | < 1.5 % "
        f"| MRE (first {min(args.early_steps, args.steps)} steps) | autocompare flags (tiny model, one step) |",
        "|---|---|---|---|---|---|---|"
    ]
    for name, description, diff, early, flagged in rows:
        table.append(f"| {name} | {description} | {100 * diff.mre:.4f}% | {100 * diff.max_relative_error:.4f}% | "
                     f"{'yes' if diff.passed else 'no'} | {100 * early.mre:.4f}% | "
                     f"{', '.join(flagged['flagged']) or 'nothing'} |")
    text = "\n".join(table)
    print("\n" + text)
    with open(os.path.join(out, "table1.md"), "w") as handle:
        handle.write(text + "\n")
    if args.update_doc:
        with open(args.update_doc) as handle:
            doc = handle.read()
        if BEGIN not in doc or END not in doc:
            sys.exit(f"{args.update_doc}: no {BEGIN} ... {END} markers")
        start, stop = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        with open(args.update_doc, "w") as handle:
            handle.write(doc[:start] + "\n" + text + "\n" + doc[stop:])
        print(f"updated {args.update_doc}")


if __name__ == "__main__":
    main()
