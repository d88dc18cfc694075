"""Run each CUDA training script of the acceptance suite (tests/ditorch/cuda_user_scripts) N times on
dipu through `python -m ditorch`, each run checked against one CPU run of the same script with the
suite's own check (same parameters, optimizer identity, ties, exit 0, loss falling like the CPU's).

    python benchmarks/cuda_user_scripts_stress.py [--runs 10] [--only SCRIPT ...]

Prints one line per run and a final `SCRIPT passed/runs` table.
"""

import argparse
import importlib.util
import os
import sys
import time

SUITE_TEST = os.path.join(os.path.dirname(__file__), "..", "tests", "ditorch", "test_cuda_user_scripts_suite.py")


def load_suite():
    spec = importlib.util.spec_from_file_location("cuda_user_scripts_suite", SUITE_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--only", nargs="*", help="script names (default: the whole suite)")
    args = parser.parse_args()
    suite = load_suite()
    scripts = args.only or list(suite.SUITE)
    unknown = sorted(set(scripts) - set(suite.SUITE))
    if unknown:
        sys.exit(f"cuda_user_scripts_stress: unknown script(s) {', '.join(unknown)}; the suite has "
                 f"{', '.join(suite.SUITE)}")
    passed = {}
    for script in scripts:
        processes = suite.SUITE[script][0]
        cpu_run = suite.run_script(script, processes, "cpu")
        passed[script] = 0
        for run in range(1, args.runs + 1):
            started = time.perf_counter()
            dipu_run = suite.run_script(script, processes, None)
            try:
                suite.check_trains_like_cpu(script, cpu_run, dipu_run)
                verdict = "ok"
                passed[script] += 1
            except AssertionError as error:
                verdict = f"FAILED rc={dipu_run.returncode}: {str(error).splitlines()[0][:200]}"
            print(f"{script} run {run}/{args.runs}: {verdict} ({time.perf_counter() - started:.1f}s)", flush=True)
    print("\nscript                         passed/runs")
    for script, count in passed.items():
        print(f"{script:30} {count}/{args.runs}")
    sys.exit(0 if all(count == args.runs for count in passed.values()) else 1)


if __name__ == "__main__":
    main()
