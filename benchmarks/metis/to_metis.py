"""Convert an H2 cluster file, its (synthesised) profiles and model into Metis's inputs, and Metis's plans
back into H2 strategy files. Metis (github.com/SamsungLabs/Metis) is not part of this repository.

    .venv/bin/python benchmarks/metis/to_metis.py --cluster benchmarks/metis/cluster.yaml --out DIR

writes DIR/hostfile, DIR/clusterfile.json and DIR/profile/DeviceType.{TYPE}_tp{T}_bs{B}.json, and prints
the arguments for Metis's cost_het_cluster.py. What each of Metis's fields receives (its README's
"Profile Data Structure" and what its code reads):
- layers: Metis counts the embedding and the head as layers, so num_layers = L + 2;
  layer_compute_total_ms = forward + backward of one micro-batch of bs sequences at tp, per layer
  (embedding, L decoder layers, head matmul), from the same profile the H2 planner reads;
  forward_backward_time_ms adds the loss (cross-entropy over the logits) to their sum;
- optimizer_time_ms: Adam over the whole model on one chip at tp 1 (Metis reads it from whichever file
  it loads first, so every file carries the same value: the slowest type's);
- parameters_per_layer_bytes: bf16 weights per layer at tp 1 (Metis divides by tp itself);
- layer_memory_total_mb: per chip at (tp, bs), what H2's memory model gives one layer (its states and
  one micro-batch of activations), in MiB; Metis compares it with the device memory x 1024;
- clusterfile: per node its type, memory (the usable capacity in GiB) and bandwidths in MiB per
  millisecond: Metis's estimator (model/cost_estimator.py `_get_pp_cost`, `_get_dp_cost`) divides bytes
  by bandwidth x 1024 x 1024 and adds the quotient to profile times in milliseconds, so the bandwidth must
  be in MiB/ms for its transfer terms to come out in ms. (Metis's README sample gives bytes/s, 312500000
  for 2.5 Gb/s, which would make every transfer about 10^9 times too cheap; an earlier version of this
  bridge gave MiB/s, which made them 1000 times too cheap.) Metis's GPUCluster.get_inter_bandwidth
  returns the node's intra_bandwidth (its code, run unmodified), so its estimator prices inter-node
  transfers at the intra-node bandwidth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys

from h2.core.cluster import ClusterSpec, TrainingSpec, load_cluster
from h2.core.model_config import ModelConfig, resolve_model
from h2.core.strategy import StageSpec, Strategy
from heteroauto.memory import layer_shard_params, state_bytes_per_param
from heteroauto.profiles import synthesise_profile, update_s_per_layer
from heteroauto.stage_terms import embedding_terms, head_terms

MIB = 1 << 20


def metis_bandwidth(gbps: float) -> float:
    """A link of `gbps` GB/s in Metis's bandwidth unit, MiB per millisecond."""
    return gbps * 1e9 / 1e3 / MIB


METIS_TYPES = ("A100", "V100", "P100", "T4")  # the device types Metis's utils.DeviceType knows


def problem(cluster_path: str) -> tuple[ClusterSpec, ModelConfig, TrainingSpec]:
    cluster = load_cluster(cluster_path)
    model = resolve_model(os.path.join(os.path.dirname(cluster_path), cluster.model))
    return cluster, model, cluster.training


def batch_sizes(training: TrainingSpec) -> list[int]:
    sizes, size = [], 1
    while size <= min(8, training.sequences):
        sizes.append(size)
        size *= 2
    return sizes


def profile_json(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, chip_name: str, tp: int,
                 batch: int) -> dict:
    chip = cluster.chip(chip_name)
    at_batch = dataclasses.replace(training, micro_batch_size=batch)
    profile = synthesise_profile(chip, model, at_batch)
    layer = profile.layer(tp)
    embedding = embedding_terms(model, at_batch, chip, profile, tp=tp, dp=1, micro_batch_size=batch)
    head = head_terms(model, at_batch, chip, profile, layer, dp=1, micro_batch_size=batch)
    logits_pass = batch * training.seq_len * model.vocab_size / tp * 4 / (chip.memory_bandwidth_gbps * 1e9)
    loss_ms = 4 * logits_pass * 1e3
    head_ms = (head.forward_s + head.backward_s) * 1e3 - loss_ms
    computes = ([(embedding.forward_s + embedding.backward_s) * 1e3] +
                [(layer.forward_s + layer.backward_s) * 1e3] * model.num_layers + [head_ms])
    per_param = state_bytes_per_param(training, 1)
    layer_mb = (layer_shard_params(model, tp) * per_param + layer.activation_bytes) / MIB
    embedding_mb = (model.embedding_params() / tp * per_param + layer.recompute_activation_bytes) / MIB
    head_mb = ((model.head_params() / tp + model.final_norm_params()) * per_param +
               batch * training.seq_len * model.vocab_size / tp * 4) / MIB
    weights = [model.embedding_params() * training.weight_bytes] + \
              [model.layer_params() * training.weight_bytes] * model.num_layers + \
              [(model.head_params() + model.final_norm_params()) * training.weight_bytes]
    optimizer_ms = max(update_s_per_layer(model, training, c, 1, 1) for c in cluster.chips) * \
        (model.num_layers + 2) * 1e3
    return {
        "model": {
            "model_name": model.name, "num_layers": model.num_layers + 2, "parameters": {
                "total_parameters_bytes": sum(weights), "parameters_per_layer_bytes": weights,
                "activation_parameters_bytes": weights
            }
        },
        "execution_time": {
            "total_time_ms": sum(computes) + loss_ms + optimizer_ms,
            "forward_backward_time_ms": sum(computes) + loss_ms, "batch_generator_time_ms": 0.0,
            "layernorm_grads_all_reduce_time_ms": 0.0, "embedding_grads_all_reduce_time_ms": 0.0,
            "optimizer_time_ms": optimizer_ms, "layer_compute_total_ms": computes
        },
        "execution_memory": {
            "total_memory_mb": embedding_mb + layer_mb * model.num_layers + head_mb,
            "layer_memory_total_mb": [embedding_mb] + [layer_mb] * model.num_layers + [head_mb]
        },
    }


def write_inputs(cluster_path: str, out: str) -> list[str]:
    """Metis's input files for the cluster; returns cost_het_cluster.py's arguments."""
    cluster, model, training = problem(cluster_path)
    names = [chip.name for chip in cluster.chips]
    unknown = [name for name in names if name not in METIS_TYPES]
    if unknown:
        raise SystemExit(f"{cluster_path}: chip type '{unknown[0]}' is not one Metis knows ({', '.join(METIS_TYPES)})")
    os.makedirs(os.path.join(out, "profile"), exist_ok=True)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    hosts, nodes = [], {}
    for chip in cluster.chips:
        for _ in range(chip.count // chip.chips_per_node):
            ip = f"10.0.{len(hosts) // 250}.{len(hosts) % 250 + 1}"
            hosts.append(f"{ip} slots={chip.chips_per_node}")
            nodes[ip] = {
                "instance_type": chip.name, "inter_bandwidth": metis_bandwidth(chip.inter_node_gbps),
                "intra_bandwidth": metis_bandwidth(chip.intra_node_gbps), "memory": chip.capacity_bytes / (1 << 30)
            }
    with open(os.path.join(out, "hostfile"), "w") as handle:
        handle.write("\n".join(hosts) + "\n")
    with open(os.path.join(out, "clusterfile.json"), "w") as handle:
        json.dump(nodes, handle, indent=1)
    tps = sorted({tp for chip in cluster.chips for tp in chip.tp_sizes()})
    for chip in cluster.chips:
        for tp in chip.tp_sizes():
            for batch in batch_sizes(training):
                with open(os.path.join(out, "profile", f"DeviceType.{chip.name}_tp{tp}_bs{batch}.json"), "w") as handle:
                    json.dump(profile_json(cluster, model, training, chip.name, tp, batch), handle)
    return [
        "--model_name", "GPT", "--model_size", model.name, "--num_layers",
        str(model.num_layers + 2), "--gbs",
        str(training.sequences), "--hidden_size",
        str(model.hidden_size), "--sequence_length",
        str(training.seq_len), "--vocab_size",
        str(model.vocab_size), "--attention_head_size",
        str(model.head_dim), "--hostfile_path",
        os.path.join(out, "hostfile"), "--clusterfile_path",
        os.path.join(out, "clusterfile.json"), "--profile_data_path",
        os.path.join(out, "profile"), "--max_profiled_tp_degree",
        str(max(tps)), "--max_profiled_batch_size",
        str(max(batch_sizes(training))), "--min_group_scale_variance", "1", "--max_permute_len", "4", "--home_dir", out,
        "--log_path",
        os.path.join(out, "logs")
    ]


# ---- Metis's answer back into a strategy ----------------------------------------------------------------
RESULT = re.compile(r"^(\d+), ([0-9.e+-]+), (\(.*?\)|\[.*?\]), (\[.*?\]), (\[.*?\]), (\d+), (\[.*?\])\s*$")


def metis_plans(output: str) -> list[dict]:
    """Metis's ranked result lines: rank, cost, node_sequence, device_groups, strategies, batches, partition."""
    plans = []
    for line in output.splitlines():
        match = RESULT.match(line)
        if match:
            rank, cost, sequence, groups, strategies, batches, partition = match.groups()
            plans.append({
                "rank": int(rank), "cost": float(cost), "types": re.findall(r"DeviceType\.(\w+)", sequence),
                "device_groups": json.loads(groups), "strategies": [
                    tuple(map(int, s)) for s in re.findall(r"\((\d+), (\d+)\)", strategies)
                ], "batches": int(batches), "partition": json.loads(partition)
            })
    return plans


def plan_strategy(plan: dict, cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec) -> Strategy | None:
    """Metis's plan as an H2 strategy, or None when it cannot be one (a stage mixing chip types, or one
    holding only the embedding or the head)."""
    ranks = [name for name in plan["types"] for _ in range(cluster.chip(name).count)]
    sequences = training.sequences // plan["batches"]
    dp = max(d for d, _ in plan["strategies"])
    if sequences % dp:
        return None
    stages, start = [], 0
    last = len(plan["device_groups"]) - 1
    for index, (devices, (stage_dp, tp)) in enumerate(zip(plan["device_groups"], plan["strategies"])):
        types = set(ranks[start:start + devices])
        start += devices
        layers = plan["partition"][index + 1] - plan["partition"][index] - (index == 0) - (index == last)
        if len(types) != 1 or layers < 1 or sequences % stage_dp:
            return None
        stages.append(StageSpec(chip=types.pop(), tp=tp, layers=layers, dp=stage_dp))
    return Strategy(dp=dp, micro_batches=plan["batches"], micro_batch_size=sequences // dp, stages=stages,
                    model=model.to_dict(), seq_len=training.seq_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster.yaml"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    print(" ".join(write_inputs(args.cluster, args.out)))


if __name__ == "__main__":
    sys.exit(main())
