"""Each GPU's achieved FP16 TFLOPS from the Zorse authors' measured per-layer latencies
(`data/model_latencies.json` of github.com/benson-guo/zorse), the basis of configs/chips/*-measured.yaml.

For LLaMA 7B/13B/33B/65B (our configs/models shapes) at every profiled sequence length, float16: the
per-sequence slopes of the authors' fitted forward and backward latencies (ms per layer per sequence)
against our model's forward + backward FLOPs of one layer and one sequence. Prints every entry, then
per GPU the median, range and the median as a fraction of the spec sheet's peak (our chip files).

    .venv/bin/python benchmarks/zorse_measured_chips.py --latencies model_latencies.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from h2.core.cluster import load_cluster
from h2.core.model_config import resolve_model

# the authors' GPU keys -> our chip names
GPUS = {
    "a100x40": "a100-40g", "a100x80": "a100-80g", "a10g": "a10g", "h100-nvl": "h100-nvl", "t4": "t4", "v100x16": "v100"
}


def achieved_tflops(latencies: dict) -> dict[str, list[tuple[str, int, float]]]:
    found: dict[str, list[tuple[str, int, float]]] = {chip: [] for chip in GPUS.values()}
    for size in ("7b", "13b", "33b", "65b"):
        model = resolve_model(f"configs/models/llama-{size}.yaml")
        for gpu, chip in GPUS.items():
            for seq, dtypes in latencies.get(f"deepspeedllama_{size}", {}).get(gpu, {}).items():
                entry = dtypes.get("float16")
                if not entry:
                    continue
                ms = entry[0][0] + entry[1][0]  # forward + backward slope: ms per layer per sequence
                flops = (model.layer_forward_flops_per_token(int(seq)) +
                         model.layer_backward_flops_per_token(int(seq))) * int(seq)
                found[chip].append((size, int(seq), flops / (ms * 1e-3) / 1e12))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latencies", required=True, help="the authors' data/model_latencies.json")
    args = parser.parse_args()
    with open(args.latencies) as handle:
        found = achieved_tflops(json.load(handle))
    clusters = [load_cluster(f"configs/clusters/zorse-{name}.yaml") for name in "abc"]
    peaks = {chip.name: chip.peak_tflops for cluster in clusters for chip in cluster.chips}
    medians = {}
    for chip, entries in found.items():
        print(chip, " ".join(f"{size}@{seq}:{tflops:.0f}" for size, seq, tflops in entries))
        values = [tflops for _, _, tflops in entries]
        medians[chip] = statistics.median(values)
        print(f"  median {medians[chip]:.1f} TFLOPS (range {min(values):.1f}-{max(values):.1f}, "
              f"{len(values)} entries), "
              f"{medians[chip] / peaks[chip]:.3f} of the spec sheet's {peaks[chip]:g}")
    print(f"h100-nvl / a100-80g measured: {medians['h100-nvl'] / medians['a100-80g']:.2f}")


if __name__ == "__main__":
    main()
