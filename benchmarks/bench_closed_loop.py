"""The closed loop on an emulated cluster: profile -> search -> train the planned strategy -> compare.

    .venv/bin/python benchmarks/bench_closed_loop.py [--cluster configs/clusters/local-hetero.yaml]
        [--steps 6] [--warmup 2] [--out runs/closed-loop] [--reuse-profiles]

One run, every step through the product's own command lines, as a user runs them:
  1. `heteroauto profile --cluster C`: every chip type measured on its TP ranks into OUT/profiles, afresh
     unless --reuse-profiles (an emulated chip is a fraction of the host core's speed at the time, and this
     VM's speed drifts: profiles cached 7 hours earlier predicted a Zorse step 1.27x too short);
  2. `heteroauto search --profiles OUT/profiles`: the planned strategy, and `heteroauto simulate` of it
     (the cost model's and the simulator's iteration time, the memory model's per-stage bytes);
  3. the uniform layer split on the same stages (same chips, tp, dp and recompute; layers as even as
     possible, the extra ones on the earlier stages, which have the larger memories), simulated too;
  4. `h2 train --strategy S --cluster C` of both: the median step time after `--warmup` steps, each
     stage's peak device memory and how much of its emulated kernel time the host made late
     (stage_report.json), each chip's emulated kernel seconds and its ranks' host CPU.
It prints predicted against measured step time (ratios to the cost model and to the simulator), per
stage the memory model against the measured peak and the simulator's busy time of each chip against
the emulated kernel time it ran (with the host cores its ranks used: a step longer than predicted on
chips that did the predicted work means the host did not feed them), the measured speed-up of the
plan over the uniform split, and the machine's load before and after (uptime). The figures are the emulated chips'; the
acceptance targets it checks: within 15 % of the simulator, within 20 % of the cost model, memory
within 15 %, speed-up >= 1.3 (each line says PASS or FAIL).

Only a trustworthy measurement gets a PASS or FAIL (h2.core.emulation.measurement_trust): when a profile
or a training run had more than 5 % of its emulated kernel time late (the host's load decided it, not the
emulated chips), every target line says INVALID instead, with the measurement that was, and the benchmark
exits 3. So does a host that other work already keeps busy (over half its cores in the second before the
benchmark starts anything). Exit status: 0 every target PASS, 1 a FAIL, 3 INVALID (the profile step refusing
its measurement and a busy host included), anything else a command that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import yaml

from h2.core.emulation import CORE_SHARE_LIMIT, MeasurementTrust, measurement_trust, stage_report_trust

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"simulator": 0.15, "cost model": 0.20, "memory": 0.15, "speed-up": 1.3}
EXIT_FAIL, EXIT_INVALID = 1, 3


def load() -> str:
    with open("/proc/loadavg") as handle:
        return "load average " + " ".join(handle.read().split()[:3])


def cpu_times() -> tuple[int, int]:
    """The host's (idle, total) CPU time so far, in clock ticks over every core (/proc/stat)."""
    with open("/proc/stat") as handle:
        ticks = [int(value) for value in handle.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks[:8])  # idle + iowait; user .. steal


def refuse_a_busy_host(window_s: float = 1.0) -> None:
    """INVALID, exit 3, before anything starts, when other work kept more than 1 - CORE_SHARE_LIMIT of the
    host's cores busy over `window_s`: the emulated chips could not get their share (the trust rule's
    budget), and measuring profiles under that load would take many times as long only to be refused."""
    idle_before, total_before = cpu_times()
    time.sleep(window_s)
    idle_after, total_after = cpu_times()
    busy = 1.0 - (idle_after - idle_before) / max(1, total_after - total_before)
    if busy > 1.0 - CORE_SHARE_LIMIT:
        print(f"INVALID: other work kept {busy:.0%} of the host's cores busy before the benchmark started (more "
              f"than {1.0 - CORE_SHARE_LIMIT:.0%} leaves the emulated chips less than their share); {load()}")
        sys.exit(EXIT_INVALID)


def command(*args: str, capture: bool = True) -> str:
    """Run a project command line (python -m MODULE ...); its stdout, or exit with its stderr."""
    run = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, text=True,
                         stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
    if run.returncode != 0:
        sys.exit(f"bench_closed_loop: `{' '.join(args)}` failed (exit {run.returncode}):\n"
                 f"{(run.stderr or '')[-3000:]}")
    return run.stdout or ""


def profile(cluster: str, folder: str, *, reuse: bool = False) -> dict[str, MeasurementTrust]:
    """`heteroauto profile` into `folder` (the profiles there removed first unless `reuse`: they would be
    taken where up to date); the trust of each chip's profile there. A profile step that refuses its
    measurement (INVALID, exit 2) ends the benchmark: INVALID, exit 3."""
    if not reuse and os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith(".yaml"):
                os.remove(os.path.join(folder, name))
    run = subprocess.run([
        sys.executable, "-m", "h2.cli.heteroauto", "profile", "--cluster", cluster, "--out-dir", folder
    ], cwd=REPO_ROOT, text=True, stderr=subprocess.PIPE)
    sys.stderr.write(run.stderr)
    if run.returncode == 2 and "INVALID" in run.stderr:
        refusal = run.stderr.strip().splitlines()[-1].removeprefix("heteroauto: error: ")
        print(f"INVALID: the profile step refused its measurement (exit 2): {refusal}")
        print(f"after: {load()}")
        sys.exit(EXIT_INVALID)
    if run.returncode != 0:
        sys.exit(f"bench_closed_loop: `heteroauto profile` failed (exit {run.returncode})")
    return profile_trust(folder)


def profile_trust(folder: str) -> dict[str, MeasurementTrust]:
    """Each profile's verdict (a profile written with --force on a busy host says `trusted: false`)."""
    trust = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".yaml"):
            with open(os.path.join(folder, name)) as handle:
                data = yaml.safe_load(handle) or {}
            late = float(data.get("late_fraction", 0.0)) if data.get("trusted") is False else 0.0
            trust[f"profile {name[:-len('.yaml')]}"] = measurement_trust(late, 1.0)
    return trust


def verdicts(checks: list[tuple[bool, str]], trust: dict[str, MeasurementTrust]) -> int:
    """Each target's line: PASS or FAIL when every measurement is trusted, else INVALID (and which one was
    not); the exit status."""
    invalid = {name: measured for name, measured in trust.items() if not measured.trusted}
    for name, measured in invalid.items():
        print(f"INVALID measurement, {name}: {measured.describe()}")
    for ok, line in checks:
        print(f"{'INVALID' if invalid else verdict(ok)} {line}")
    if invalid:
        return EXIT_INVALID
    return 0 if all(ok for ok, _ in checks) else EXIT_FAIL


def uniform_split(strategy: dict) -> dict:
    """The same stages with the layers split as evenly as possible (extra layers on the earlier stages)."""
    stages = strategy["stages"]
    total = sum(stage["layers"] for stage in stages)
    share, extra = divmod(total, len(stages))
    uniform = dict(strategy)
    uniform["stages"] = [{**stage, "layers": share + (1 if index < extra else 0)} for index, stage in enumerate(stages)]
    return uniform


def simulate(cluster: str, strategy: str, profiles: str) -> dict:
    return json.loads(
        command("h2.cli.heteroauto", "simulate", "--cluster", cluster, "--strategy", strategy, "--profiles", profiles,
                "--json"))


def train(cluster: str, strategy: str, out: str, steps: int, warmup: int) -> dict:
    """Train `steps` steps; the median step time after `warmup` steps and the stage report."""
    if os.path.exists(os.path.join(out, "metrics.jsonl")):
        os.remove(os.path.join(out, "metrics.jsonl"))
    command("h2.cli.main", "train", "--strategy", strategy, "--cluster", cluster, "--steps", str(steps), "--out", out,
            "--log-every", str(steps), capture=False)
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    with open(os.path.join(out, "stage_report.json")) as handle:
        report = json.load(handle)
    return {
        "step_s": statistics.median(r["step_time_s"]
                                    for r in records[warmup:]), "steps": [r["step_time_s"]
                                                                          for r in records], "stages": report
    }


def chip_work(results: dict) -> None:
    """Per stage, the work on each of its chips per step: what the simulator schedules (profiled
    compute, busy_s) against the emulated kernel seconds the chip really ran (stage_report.json,
    per rank and step), and the host CPU its ranks spent in steps as cores. Where the chips did the
    predicted work but the step took longer, the host did not feed them: its ranks could not get
    the host cores they needed."""
    for name, result in results.items():
        steps = result["measured"]["steps"]
        wall = sum(steps)
        for model_row, measured_row in zip(result["predicted"]["stages"], result["measured"]["stages"]):
            chips = model_row["tp"] * model_row["dp"]
            measured = measured_row["emulated_s"] / chips / len(steps)
            host = measured_row.get("host_cpu_s", 0.0) / wall
            print(f"{name:<9} {measured_row['stage']:>5} {measured_row['chip']:>9} {model_row['busy_s']:>28.3f} "
                  f"{measured:>9.3f} {measured / model_row['busy_s']:>18.3f} {host:>15.2f}")
        claimed = sum(row.get("host_cpu_s", 0.0) for row in result["measured"]["stages"]) / wall
        print(f"{name:<9} all ranks: {claimed:.2f} host cores used in steps")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="configs/clusters/local-hetero.yaml")
    parser.add_argument("--steps", type=int, default=6, help="training steps of each strategy")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--out", default="runs/closed-loop")
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="take the up-to-date profiles in OUT/profiles instead of measuring every chip type")
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be below --steps")
    out = os.path.abspath(args.out)
    profiles = os.path.join(out, "profiles")
    os.makedirs(out, exist_ok=True)
    print(f"closed loop on {args.cluster} (emulated chips); before: {load()}", flush=True)
    refuse_a_busy_host()

    trust = profile(args.cluster, profiles, reuse=args.reuse_profiles)
    plan_path, uniform_path = os.path.join(out, "planned.yaml"), os.path.join(out, "uniform.yaml")
    searched = json.loads(
        command("h2.cli.heteroauto", "search", "--cluster", args.cluster, "--profiles", profiles, "--out", plan_path,
                "--json", "--no-baselines"))
    with open(plan_path) as handle:
        plan = yaml.safe_load(handle)
    with open(uniform_path, "w") as handle:
        yaml.safe_dump(uniform_split(plan), handle, sort_keys=False, default_flow_style=None)

    results = {}
    for name, path in (("planned", plan_path), ("uniform", uniform_path)):
        predicted = simulate(args.cluster, path, profiles)
        if not predicted["fits"]:
            sys.exit(f"bench_closed_loop: the {name} strategy {path} does not fit the memory model; it would run out "
                     f"of the emulated memory")
        measured = train(args.cluster, path, os.path.join(out, name), args.steps, args.warmup)
        results[name] = {"predicted": predicted, "measured": measured}
    after = load()

    print(f"\nplanned strategy (heteroauto search, {searched['evaluated']} configurations evaluated): " +
          ", ".join(f"{s['chip']} tp {s['tp']} layers {s['layers']}{' recompute' if s['recompute'] else ''}"
                    for s in searched["strategy"]["stages"]))
    print("uniform split: " + ", ".join(f"{s['chip']} layers {s['layers']}" for s in uniform_split(plan)["stages"]))
    print(f"\n{'strategy':<9} {'cost model s':>12} {'simulator s':>12} {'measured s':>11} "
          f"{'measured/cost':>13} {'measured/sim':>12}  steps (s)")
    for name, result in results.items():
        cost, sim = result["predicted"]["cost_model_iteration_s"], result["predicted"]["iteration_s"]
        step = result["measured"]["step_s"]
        steps = " ".join(f"{s:.2f}" for s in result["measured"]["steps"])
        print(f"{name:<9} {cost:>12.3f} {sim:>12.3f} {step:>11.3f} {step / cost:>13.3f} {step / sim:>12.3f}  {steps}")

    print(f"\n{'strategy':<9} {'stage':>5} {'chip':>9} {'model MB':>9} {'measured MB':>11} {'measured/model':>14} "
          f"{'late kernel time':>16}")
    memory_ratios = []
    for name, result in results.items():
        for model_row, measured_row in zip(result["predicted"]["stages"], result["measured"]["stages"]):
            model_mb = model_row["memory_gb"] * 1e3
            measured_mb = measured_row["peak_allocated_bytes"] / 1e6
            late = measured_row["overrun_s"] / measured_row["emulated_s"] if measured_row["emulated_s"] else 0.0
            memory_ratios.append(measured_mb / model_mb)
            print(
                f"{name:<9} {measured_row['stage']:>5} {measured_row['chip']:>9} {model_mb:>9.2f} {measured_mb:>11.2f} "
                f"{measured_mb / model_mb:>14.3f} {late:>16.2%}")

    print(f"\n{'strategy':<9} {'stage':>5} {'chip':>9} {'chip busy s/step: simulator':>28} {'measured':>9} "
          f"{'measured/simulator':>18} {'host cores used':>15}")
    chip_work(results)

    plan, uniform = results["planned"], results["uniform"]
    speedup = uniform["measured"]["step_s"] / plan["measured"]["step_s"]
    predicted_speedup = uniform["predicted"]["iteration_s"] / plan["predicted"]["iteration_s"]
    print(f"\nplanned vs uniform split, measured: {uniform['measured']['step_s']:.3f} s / "
          f"{plan['measured']['step_s']:.3f} s = {speedup:.2f}x (simulator predicted {predicted_speedup:.2f}x)")
    sim_error = abs(plan["measured"]["step_s"] / plan["predicted"]["iteration_s"] - 1)
    cost_error = abs(plan["measured"]["step_s"] / plan["predicted"]["cost_model_iteration_s"] - 1)
    memory_error = max(abs(r - 1) for r in memory_ratios)
    for name, result in results.items():
        trust[f"{name} run"] = stage_report_trust(result["measured"]["stages"])
    status = verdicts([
        (sim_error
         <= TARGETS['simulator'], f"planned step within {TARGETS['simulator']:.0%} of the simulator ({sim_error:.1%})"),
        (cost_error <= TARGETS['cost model'],
         f"planned step within {TARGETS['cost model']:.0%} of the cost model ({cost_error:.1%})"),
        (memory_error <= TARGETS['memory'],
         f"every stage's peak memory within {TARGETS['memory']:.0%} of the memory model (worst {memory_error:.1%})"),
        (speedup >= TARGETS['speed-up'],
         f"planned at least {TARGETS['speed-up']}x faster than the uniform split ({speedup:.2f}x)"),
    ], trust)
    print(f"after: {after}")
    return status


if __name__ == "__main__":
    sys.exit(main())
