"""What the paper's shortcuts lose, and that the default search loses nothing, against the exhaustive oracle
on random small clusters (tests/heteroauto's generator, up to three chip types, groups of 2 chips).

    .venv/bin/python benchmarks/bench_heuristic_gap.py [--seeds 1000:1400]

Per feasible random problem:
- the default search (every dp, stage order and tp sequence, full cost model) against the oracle over
  the same space and model: must be equal;
- the paper's procedure (`--search paper`: larger-memory-first order, dp fixed by stage 1, tp not growing
  along a type; paper cost model) against the oracle under the paper's cost model: the gap, and what the
  oracle's plan has that the procedure cannot reach (another stage order, tp growing along a type, or
  else the dp / grouping the two stages fixed); problems the procedure finds infeasible and the oracle
  does not are counted apart.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "heteroauto"))

from autohelpers import random_problem  # noqa: E402
from h2.core.errors import UserError  # noqa: E402
from heteroauto import paper_search  # noqa: E402
from heteroauto.oracle import oracle_search  # noqa: E402
from heteroauto.profiles import profiles_for  # noqa: E402
from heteroauto.search import search  # noqa: E402

GROUP = 2


def objective_or_none(run):
    try:
        result = run()
    except UserError:
        return None
    return result.objective_s if hasattr(result, "objective_s") else result.best.objective_s


def cause(strategy, cluster) -> str:
    """What the oracle's plan has that the paper's procedure cannot reach."""
    chips = [stage.chip for stage in strategy.stages]
    order = [name for index, name in enumerate(chips) if index == 0 or chips[index - 1] != name]
    by_memory = [chip.name for chip in sorted(cluster.chips, key=lambda c: -c.memory_gb) if chip.name in order]
    if order != by_memory:
        return "stage order"
    for a, b in zip(strategy.stages, strategy.stages[1:]):
        if a.chip == b.chip and b.tp > a.tp:
            return "tp growing along a type"
    return "dp / grouping fixed by stage 1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1000:1400")
    args = parser.parse_args()
    start, stop = map(int, args.seeds.split(":"))
    exact_checked = exact_wrong = paper_checked = paper_infeasible = 0
    losses = []
    for seed in range(start, stop):
        cluster, model, training = random_problem(random.Random(seed), max_types=3)
        profiles = profiles_for(cluster, model, training)
        try:
            full_oracle = oracle_search(cluster, model, training, profiles, group_size=GROUP)
        except UserError:  # infeasible, or too large for the oracle
            full_oracle = None
        if full_oracle is not None:
            exact = objective_or_none(lambda: search(cluster, model, training, profiles, group_size=GROUP))
            exact_checked += 1
            exact_wrong += exact is None or abs(exact - full_oracle.objective_s) > 1e-9 * full_oracle.objective_s
        try:
            oracle = oracle_search(cluster, model, training, profiles, cost_model="paper", group_size=GROUP)
        except UserError:
            continue
        paper_checked += 1
        procedure = objective_or_none(lambda: paper_search.search(cluster, model, training, profiles, group_size=GROUP))
        if procedure is None:
            paper_infeasible += 1
        elif procedure > oracle.objective_s * (1 + 1e-9):
            losses.append((procedure / oracle.objective_s - 1, seed, cause(oracle.strategy, cluster)))
    print(f"seeds {start}..{stop - 1} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"default search vs oracle (full cost model):  {exact_checked} compared, {exact_wrong} different")
    print(f"paper's procedure vs oracle (paper's model): {paper_checked} compared, {len(losses)} worse" +
          (f" (largest gap {max(losses)[0] * 100:.2f}%)" if losses else "") +
          f", {paper_infeasible} found infeasible though a plan exists")
    for reason in sorted({reason for _, _, reason in losses}):
        gaps = [gap for gap, _, r in losses if r == reason]
        print(f"  {reason}: {len(gaps)} worse, largest {max(gaps) * 100:.2f}%")
    for gap, seed, reason in sorted(losses, reverse=True)[:10]:
        print(f"  seed {seed}: {gap * 100:.2f}% worse ({reason})")


if __name__ == "__main__":
    main()
