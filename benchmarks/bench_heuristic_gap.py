"""How far the search is from the exhaustive oracle on random small clusters (tests/heteroauto's generator).

    .venv/bin/python benchmarks/bench_heuristic_gap.py [--seeds 1000:1400]

Three comparisons per feasible random problem (up to two chip types, groups of 2 chips in stage 2):
- stage 1 (chip types as groups) against the oracle over the same space: must be equal;
- the two-stage result against min(stage 1, oracle over stage 2's space: stage 1's dp, tp not growing
  along a type): must be equal (the pruning keeps the optimum);
- the two-stage result against the oracle over all groupings with any dp and tp order: the paper's
  heuristic may lose here; the gap is printed, with its cause (dp different from stage 1's, or tp order).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "heteroauto"))

from autohelpers import random_problem  # noqa: E402
from h2.core.errors import UserError  # noqa: E402
from heteropp.auto.oracle import oracle_search  # noqa: E402
from heteropp.auto.profiles import profiles_for  # noqa: E402
from heteropp.auto.search import search  # noqa: E402


def best_or_none(fn):
    try:
        return fn().best.objective_s
    except UserError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1000:1400")
    args = parser.parse_args()
    start, stop = map(int, args.seeds.split(":"))
    stage1_checked = stage1_wrong = stage2_checked = stage2_wrong = grouped = 0
    losses = []
    for seed in range(start, stop):
        cluster, model, training = random_problem(random.Random(seed), max_types=2)
        profiles = profiles_for(cluster, model, training)
        oracle = best_or_none(lambda: oracle_search(cluster, model, training, profiles))
        try:
            first = search(cluster, model, training, profiles, group_size=None)
        except UserError:
            stage1_wrong += oracle is not None
            continue
        stage1_checked += 1
        stage1_wrong += oracle is None or abs(first.best.objective_s - oracle) > 1e-9 * oracle
        two = search(cluster, model, training, profiles, group_size=2).best.objective_s
        space = best_or_none(lambda: oracle_search(cluster, model, training, profiles, group_size=2,
                                                   dp=first.best.dp, monotone_tp=True))
        expected = min(first.best.objective_s, space if space is not None else float("inf"))
        stage2_checked += 1
        stage2_wrong += abs(two - expected) > 1e-9 * expected
        try:
            full = oracle_search(cluster, model, training, profiles, group_size=2).best
        except UserError:  # too large for the oracle, or nothing fits once split
            continue
        grouped += 1
        if two > full.objective_s * (1 + 1e-9):
            cause = "dp" if full.dp != first.best.dp else "tp order"
            every_dp = search(cluster, model, training, profiles, group_size=2, refine_all_dp=True).best.objective_s
            losses.append((two / full.objective_s - 1, seed, cause, every_dp / full.objective_s - 1))
    print(f"seeds {start}..{stop - 1}")
    print(f"stage 1 vs oracle (same space):            {stage1_checked} compared, {stage1_wrong} different")
    print(f"two-stage vs oracle over stage 2's space:  {stage2_checked} compared, {stage2_wrong} different")
    print(f"two-stage vs oracle over every grouping:   {grouped} compared, {len(losses)} worse"
          + (f", largest gap {max(losses)[0] * 100:.2f}%" if losses else ""))
    for gap, seed, cause, every_dp_gap in sorted(losses, reverse=True):
        print(f"  seed {seed}: {gap * 100:.2f}% worse, cause: {cause}; with --refine-all-dp: "
              f"{every_dp_gap * 100:.2f}% worse")


if __name__ == "__main__":
    main()
