"""What one pipeline stage costs per micro-batch and per step, under a cost model: the terms that the
closed-form cost model (cost.py) and the event-driven simulator (simulator.py) both read, so the two
always price the same things.

Cost models:
- "paper": the H2 paper's (section 4.3.2): decoder layers only (compute per micro-batch, update per
  step); no embedding or head, no stage-to-stage transfers.
- "full": the paper's terms plus
  * the embedding on the first stage: lookup and its gradient's scatter-add (memory-bound passes over
    the s x b x h activation at the chip's memory bandwidth) and the all-reduce of its output over
    the TP group; the LM head and loss on the last stage: the vocab-parallel head matmul at the
    layer's achieved FLOP rate (the layer's profiled time scaled by the FLOP ratio) and the
    cross-entropy's memory-bound passes over the fp32 logits;
  * their optimizer update and gradient all-reduce, at the profile's per-parameter update rate (the
    profile's per-layer update is optimizer step + data-parallel gradient all-reduce, none of it
    hidden: HeteroPP reduces gradients after the step's last backward, heteropp/data_parallel.py);
  * the transfer of one micro-batch's activation (forward) and gradient (backward) to the next stage:
    one copy of the micro-batch crosses, spread over the smaller side's tp x dp chips, at the link
    class between the two stages (link_between_stages), plus the link's latency.

Must not import the search or the runtime; pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from h2.core import links
from h2.core.cluster import ChipType, ClusterSpec, TrainingSpec
from h2.core.errors import UserError
from h2.core.links import Link
from h2.core.model_config import ModelConfig
from heteroauto.memory import layer_shard_params
from heteroauto.profiles import LayerProfile, Profile, ring_allreduce_s

COST_MODELS = ("full", "paper")
FP32_BYTES = 4


def check_cost_model(name: str) -> str:
    if name not in COST_MODELS:
        raise UserError(f"--cost-model: unknown cost model '{name}' (known: {', '.join(COST_MODELS)})")
    return name


@dataclass(frozen=True)
class StageTerms:
    """One stage: per micro-batch forward_s and backward_s (input and weight gradients plus recompute;
    weight_grad_s is the part a deferred W pass takes), per step update_s, and the transfer of one
    micro-batch to the next stage (0 on the last): send_occupancy_s keeps the link busy, then
    send_latency_s passes before it arrives."""
    forward_s: float
    backward_s: float
    weight_grad_s: float
    update_s: float
    send_occupancy_s: float = 0.0
    send_latency_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def send_s(self) -> float:
        return self.send_occupancy_s + self.send_latency_s


def link_between_stages(cluster: ClusterSpec, chip_a: ChipType, chip_b: ChipType) -> Link:
    """The link between two adjacent stages, per chip type (the search places no ranks on nodes):
    stages of one type sit on different nodes (inter_node), stages of two types on different kinds of
    node (inter_type); the cluster file's `links:` section when it sets the class, else the chips'
    own fields (h2.core.links)."""
    second_node = 1 if chip_a.name == chip_b.name else 0
    return links.link_between(cluster, links.Location(chip_a.name, 0), links.Location(chip_b.name, second_node))[1]


def micro_batch_activation_bytes(model: ModelConfig, training: TrainingSpec, sequences: int) -> float:
    """One copy of a micro-batch's s x b x h activation (or its gradient)."""
    return float(sequences) * training.seq_len * model.hidden_size * training.activation_bytes_per_element


def transfer_s(cluster: ClusterSpec, model: ModelConfig, training: TrainingSpec, sequences: int, chip_a: ChipType,
               lanes_a: int, chip_b: ChipType, lanes_b: int) -> tuple[float, float]:
    """(link occupancy, latency) of one micro-batch of `sequences` between stages of lanes_a and lanes_b
    (tp x dp) chips: one copy crosses, spread over the smaller side's chips, each with its own NIC."""
    link = link_between_stages(cluster, chip_a, chip_b)
    occupancy = micro_batch_activation_bytes(model, training, sequences) / min(lanes_a, lanes_b) / link.bytes_per_s
    return occupancy, link.latency_s


@dataclass(frozen=True)
class EndTerms:
    """The embedding's (first stage) or the head's (last stage) extra forward, backward and update: the
    forward and backward the chip's profile measured where it measured them (heteroauto profile), else the
    formula's; the update always the formula's. The search's options and the strategy's evaluation both
    price a stage's ends here, so the plan the search minimises is the one the evaluation scores."""
    forward_s: float
    backward_s: float
    update_s: float


def embedding_terms(model: ModelConfig, training: TrainingSpec, chip: ChipType, profile: Profile, *, tp: int, dp: int,
                    micro_batch_size: int) -> EndTerms:
    """Lookup (read the rows, write the activation) and its gradient's scatter-add into fp32, plus the
    all-reduce of the vocab-parallel embedding's output over the TP group, per micro-batch; and the
    update of its vocab / tp rows."""
    update = _update_of(model, profile, dp=dp, tp=tp, params=model.embedding_params() / tp)
    measured = profile.stage_end(tp)
    if measured is not None:  # the profile's own (heteroauto profile), at the training's micro-batch size
        ratio = micro_batch_size / training.micro_batch_size
        return EndTerms(forward_s=measured.embedding_forward_s * ratio,
                        backward_s=measured.embedding_backward_s * ratio, update_s=update)
    elements = micro_batch_size * training.seq_len * model.hidden_size
    bandwidth = chip.memory_bandwidth_gbps * 1e9
    collective = ring_allreduce_s(elements * training.activation_bytes_per_element, tp, chip.intra_node_gbps,
                                  chip.latency_us)
    forward = 2 * elements * training.activation_bytes_per_element / bandwidth + collective
    backward = elements * (training.activation_bytes_per_element + 2 * FP32_BYTES) / bandwidth
    return EndTerms(forward_s=forward, backward_s=backward, update_s=update)


def head_terms(model: ModelConfig, training: TrainingSpec, chip: ChipType, profile: Profile, layer: LayerProfile, *,
               dp: int, micro_batch_size: int) -> EndTerms:
    """The vocab-parallel head at the decoder layer's achieved FLOP rate (forward 2hV, backward 4hV FLOPs per
    token against the layer's forward FLOPs and profiled forward time), the loss's two memory-bound passes
    each way over the fp32 logits; and the update of the head and final norm."""
    tp = layer.tp
    update = _update_of(model, profile, dp=dp, tp=tp, params=model.head_params() / tp + model.final_norm_params())
    measured = profile.stage_end(tp)
    if measured is not None:  # the profile's own (heteroauto profile), at the training's micro-batch size
        ratio = micro_batch_size / training.micro_batch_size
        return EndTerms(forward_s=measured.head_forward_s * ratio, backward_s=measured.head_backward_s * ratio,
                        update_s=update)
    tokens = micro_batch_size * training.seq_len
    rate_s_per_flop = layer.forward_s / (model.layer_forward_flops_per_token(training.seq_len) * tokens)
    matmul = model.head_forward_flops_per_token() * tokens * rate_s_per_flop
    logits_pass = tokens * model.vocab_size / tp * FP32_BYTES / (chip.memory_bandwidth_gbps * 1e9)
    return EndTerms(forward_s=matmul + 2 * logits_pass, backward_s=2 * matmul + 2 * logits_pass, update_s=update)


def _update_of(model: ModelConfig, profile: Profile, *, dp: int, tp: int, params: float) -> float:
    """Update time of `params` parameters of one chip at the profile's per-parameter rate at (dp, tp)."""
    per_layer = profile.update_s(dp, tp) or 0.0
    return per_layer * params / layer_shard_params(model, tp)
