"""The search minimises the objective the evaluation scores: a stage's embedding and head are priced in one
place (stage_terms.EndTerms: the profile's measured time where it has one), so on measured profiles whose
stage ends differ from the formula the every-order search's best plan is the best the evaluation knows.

The profiles are the two chips of tests/dipu/test_opencl_pipeline.py as `heteroauto profile` measured them
in a CI run (host vendor and OpenCL on the CPU): with the formula's ends in the search and the measured ones
in the evaluation, the search put the OpenCL chip first (0.0506 s evaluated) over the host chip first
(0.0455 s), and that pipeline test failed on the stage order."""

from __future__ import annotations

import yaml

from h2.core.cluster import load_cluster
from h2.core.model_config import preset
from heteroauto.problem import planning_problem
from heteroauto.search import search

TRAINING = {
    "seq_len": 32, "global_batch_sequences": 4, "micro_batch_size": 2, "zero1": False, "weight_bytes": 4,
    "gradient_bytes": 4, "optimizer_bytes": 8, "activation_bytes_per_element": 4
}
CHIP = {"count": 1, "chips_per_node": 1, "tp_max": 1, "intra_node_gbps": 2, "inter_node_gbps": 1}
CLUSTER = {
    "name": "mixed-vendor", "model": "tiny", "chips": [
        dict(CHIP, name="host-chip", memory_gb=0.008, peak_tflops=0.02),
        dict(CHIP, name="ocl-chip", memory_gb=0.0018, peak_tflops=0.04)
    ], "training": TRAINING
}
MEASURED = {  # (layer fwd, bwd, recompute s; update s per layer; embedding fwd, bwd; head fwd, bwd s)
    "host-chip": (0.0014800, 0.0018503, 0.0024886, 0.0012478, 0.0000793, 0.0002750, 0.0003149, 0.0004929),
    "ocl-chip": (0.0046314, 0.0052463, 0.0035558, 0.0072853, 0.0002574, 0.0012091, 0.0010340, 0.0017130),
}


def profile(chip: str) -> dict:
    forward, backward, recompute, update, embed_f, embed_b, head_f, head_b = MEASURED[chip]
    return {
        "chip": chip, "source": "measured", "model": "tiny", "seq_len": 32, "micro_batch_size": 2, "layers": [{
            "tp": 1, "forward_s": forward, "backward_s": backward, "recompute_s": recompute, "activation_bytes": 364032,
            "recompute_activation_bytes": 16384, "workspace_bytes": 90624
        }], "update": [{"dp": 1, "tp": 1, "seconds_per_layer": update}], "stage_ends": [{
            "tp": 1, "embedding_forward_s": embed_f, "embedding_backward_s": embed_b, "head_forward_s": head_f,
            "head_backward_s": head_b
        }]
    }


def test_the_every_order_search_picks_the_plan_the_evaluation_scores_best_on_measured_stage_ends(tmp_path):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER, sort_keys=False))
    folder = tmp_path / "profiles"
    folder.mkdir()
    for chip in MEASURED:
        (folder / f"{chip}.yaml").write_text(yaml.safe_dump(profile(chip), sort_keys=False))
    cluster, model = load_cluster(str(tmp_path / "cluster.yaml")), preset("tiny")
    problem = planning_problem(cluster, model, profile_folder=str(folder))
    profiles = problem.profiles()
    every_order = search(cluster, model, problem.training, profiles)  # one programme over both orders
    order_by_order = search(cluster, model, problem.training, profiles, top_k=2)  # each order evaluated
    best = min(order_by_order.top, key=lambda plan: plan.objective_s)
    assert [g.chip.name for g in every_order.best.groups] == ["host-chip", "ocl-chip"]
    assert every_order.best.objective_s == best.objective_s
    assert every_order.best.objective_s < max(plan.objective_s for plan in order_by_order.top) * 0.95
