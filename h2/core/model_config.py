"""Model configuration, presets, and the exact accounting the planner uses.

Pure Python (no torch): HeteroAuto reasons about the 100B preset without ever building it.

Accounting conventions (all exact functions of the config):
- A FLOP is one multiply or one add; a matmul of (m x k) by (k x n) costs 2*m*k*n.
- Attention scores count the full s x s square (QK^T and probabilities x V), as Megatron's
  FLOP formula does; a causal kernel may skip half of it.
- Backward costs twice the forward (input gradients + weight gradients); a recomputed layer
  costs one more forward.
- Activation bytes are what a decoder layer keeps alive for its backward pass, per micro-batch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from h2.core.config_io import check_path_name, dataclass_from_mapping, load_yaml_mapping
from h2.core.errors import UserError
from h2.core.hf_config import hf_config_of, is_hf_config_path, model_fields_from_hf, read_hf_config


@dataclass(frozen=True)
class ModelConfig:
    name: str = "custom"
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 176
    max_seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    # Hugging Face families (h2.core.hf_config): llama and mistral have no biases, qwen2 a bias on q, k and v.
    family: str = "llama"
    attention_head_dim: int | None = None  # None: hidden_size / num_heads
    rope_scaling: str | None = None  # None, or "llama3" (Llama 3.1's frequency-dependent scaling, below)
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, source: str = "model") -> None:
        check_path_name(self.name, f"{source}: field 'name'")  # the profile cache's profiles/<cluster>/<model>/
        largest = {
            "vocab_size": 1 << 24, "hidden_size": 1 << 20, "num_layers": 1 << 14, "num_heads": 1 << 16,
            "num_kv_heads": 1 << 16, "intermediate_size": 1 << 24, "max_seq_len": 1 << 24
        }
        for name, high in largest.items():
            if getattr(self, name) <= 0:
                raise UserError(f"{source}: field '{name}' must be positive, got {getattr(self, name)}")
            if getattr(self, name) > high:
                raise UserError(f"{source}: field '{name}' must be at most {high}, got {getattr(self, name)}")
        for name in ("rope_theta", "norm_eps", "init_std", "rope_factor", "rope_low_freq_factor",
                     "rope_high_freq_factor"):
            if not 0 < getattr(self, name) < float("inf"):
                raise UserError(f"{source}: field '{name}' must be a positive finite number, got {getattr(self, name)}")
        if self.family not in FAMILIES:
            raise UserError(f"{source}: field 'family' must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.rope_scaling not in (None, "llama3"):
            raise UserError(f"{source}: field 'rope_scaling' must be null or 'llama3', got {self.rope_scaling!r}")
        if self.rope_scaling and not self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise UserError(f"{source}: field 'rope_low_freq_factor' must be below rope_high_freq_factor")
        if self.rope_original_max_position <= 0:
            raise UserError(f"{source}: field 'rope_original_max_position' must be positive")
        self._validate_heads(source)

    def _validate_heads(self, source: str) -> None:
        if self.attention_head_dim is None and self.hidden_size % self.num_heads:
            raise UserError(f"{source}: field 'hidden_size' ({self.hidden_size}) must be divisible "
                            f"by num_heads ({self.num_heads})")
        if self.attention_head_dim is not None and not 0 < self.attention_head_dim <= 1 << 16:
            raise UserError(f"{source}: field 'attention_head_dim' must be in 1..65536, got {self.attention_head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"{source}: field 'num_kv_heads' ({self.num_kv_heads}) must divide "
                            f"num_heads ({self.num_heads})")
        if self.head_dim % 2:
            raise UserError(f"{source}: head dimension {self.head_dim} must be even for RoPE")

    # ---- shapes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_bias(self) -> bool:
        """Whether q, k and v projections carry a bias (Qwen2's attention)."""
        return self.family == "qwen2"

    # ---- parameters ---------------------------------------------------------------------
    def attention_weight_params(self) -> int:
        return 2 * self.hidden_size * (self.q_dim + self.kv_dim)  # q, k, v, o projections

    def attention_params(self) -> int:
        biases = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return self.attention_weight_params() + biases

    def mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, SwiGLU MLP and two RMSNorm weights."""
        return self.attention_params() + self.mlp_params() + 2 * self.hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """The output projection; zero when tied to the embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def final_norm_params(self) -> int:
        return self.hidden_size

    def num_parameters(self) -> int:
        return (self.embedding_params() + self.num_layers * self.layer_params() + self.final_norm_params() +
                self.head_params())

    # ---- FLOPs --------------------------------------------------------------------------
    def _seq(self, seq_len: int | None) -> int:
        return self.max_seq_len if seq_len is None else seq_len

    def layer_forward_flops_per_token(self, seq_len: int | None = None) -> int:
        matmuls = 2 * (self.attention_weight_params() + self.mlp_params())
        biases = self.attention_params() - self.attention_weight_params()  # one add each
        attention_scores = 2 * 2 * self._seq(seq_len) * self.q_dim  # QK^T and PV, full square
        return matmuls + biases + attention_scores

    def layer_backward_flops_per_token(self, seq_len: int | None = None) -> int:
        return 2 * self.layer_forward_flops_per_token(seq_len)

    def layer_recompute_flops_per_token(self, seq_len: int | None = None) -> int:
        return self.layer_forward_flops_per_token(seq_len)

    def head_forward_flops_per_token(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    def forward_flops_per_token(self, seq_len: int | None = None) -> int:
        return self.num_layers * self.layer_forward_flops_per_token(seq_len) + self.head_forward_flops_per_token()

    def training_flops_per_token(self, seq_len: int | None = None) -> int:
        """Forward plus backward (no recompute) for the whole model."""
        return 3 * self.forward_flops_per_token(seq_len)

    # ---- activations --------------------------------------------------------------------
    def layer_activation_bytes(self, micro_batch_size: int, seq_len: int | None = None, *, bytes_per_element: int = 2,
                               tp: int = 1, materialized_attention: bool = False) -> int:
        """Bytes one decoder layer keeps for backward, per micro-batch, on one of `tp` shards.

        Kept tensors: the two RMSNorm inputs and outputs (replicated across tensor parallelism:
        4*s*b*h), then sharded by tp: q (q_dim), k and v (kv_dim each), the attention output fed to
        the o projection (q_dim), the MLP gate and up outputs and their SwiGLU product (3*I), and,
        without a fused attention kernel, the softmax probabilities (heads*s*s).
        """
        s, b, h = self._seq(seq_len), micro_batch_size, self.hidden_size
        replicated = 4 * s * b * h
        sharded = s * b * (2 * self.q_dim + 2 * self.kv_dim + 3 * self.intermediate_size)
        if materialized_attention:
            sharded += b * self.num_heads * s * s
        return bytes_per_element * (replicated + sharded // tp)

    def layer_recompute_activation_bytes(self, micro_batch_size: int, seq_len: int | None = None, *,
                                         bytes_per_element: int = 2) -> int:
        """With full recompute a layer keeps only its input (s*b*h)."""
        return bytes_per_element * self._seq(seq_len) * micro_batch_size * self.hidden_size

    def to_dict(self) -> dict:
        """Every field, but the Hugging Face family fields only where they differ from their defaults: a
        preset's record (in checkpoints, plans and profile fingerprints) reads as before they existed."""
        data = dataclasses.asdict(self)
        for spec in dataclasses.fields(self):
            if spec.name in FAMILY_FIELDS and data[spec.name] == spec.default:
                del data[spec.name]
        return data

    def to_hf_config(self) -> dict:
        """This model as its family's Hugging Face config.json (H2's presets as Llama)."""
        return hf_config_of(dataclasses.asdict(self))

    def architecture(self) -> dict:
        """The fields that shape the network (what two configs must share for one's weights to fit the other)."""
        ignored = ("name", "init_std", "max_seq_len")
        return {name: value for name, value in dataclasses.asdict(self).items() if name not in ignored}


FAMILIES = ("llama", "qwen2", "mistral")
FAMILY_FIELDS = ("family", "attention_head_dim", "rope_scaling", "rope_factor", "rope_low_freq_factor",
                 "rope_high_freq_factor", "rope_original_max_position")

PRESETS: dict[str, ModelConfig] = {
    # Trains in seconds on two CPU cores; byte-level vocabulary.
    "tiny": ModelConfig(name="tiny", vocab_size=256, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                        intermediate_size=176, max_seq_len=64),
    "small": ModelConfig(name="small", vocab_size=256, hidden_size=256, num_layers=8, num_heads=8, num_kv_heads=4,
                         intermediate_size=688, max_seq_len=256),
    # The H2 paper's Table 4 model. Never instantiated: the planner uses its accounting only.
    "h2-100b": ModelConfig(name="h2-100b", vocab_size=92544, hidden_size=8192, num_layers=96, num_heads=64,
                           num_kv_heads=8, intermediate_size=36864, max_seq_len=4096, rope_theta=10000.0,
                           tie_embeddings=False),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown model preset '{name}' (known: {', '.join(PRESETS)})") from None


def load_hf_model_config(path: str | os.PathLike) -> ModelConfig:
    """The model of a Hugging Face config.json, or of the model folder holding one (h2.core.hf_config)."""
    path, data = read_hf_config(os.fspath(path))
    fields = model_fields_from_hf(data, path)
    try:
        return ModelConfig(**fields)
    except UserError as error:
        raise UserError(f"{path}: {str(error).removeprefix('model: ')}") from None


def load_model_config(path: str | os.PathLike) -> ModelConfig:
    """A model YAML (either `preset: NAME` with overrides, or every field spelled out), or a Hugging Face
    config.json (or the model folder holding one)."""
    path = os.fspath(path)
    if is_hf_config_path(path):
        return load_hf_model_config(path)
    data = load_yaml_mapping(path)
    base = data.pop("preset", None)
    if base is not None:
        if not isinstance(base, str):
            raise UserError(f"{path}: field 'preset': expected a string, got {base!r}")
        if base not in PRESETS:
            raise UserError(f"{path}: field 'preset': unknown preset '{base}' (known: {', '.join(PRESETS)})")
        data = {**PRESETS[base].to_dict(), **data}
    try:
        return dataclass_from_mapping(ModelConfig, data, path)
    except UserError as error:
        message = str(error)
        raise UserError(message if message.startswith(path) else f"{path}: {message}") from None


def resolve_model(name_or_path: str) -> ModelConfig:
    """A preset name, or a path to a model YAML or a Hugging Face config.json (or its folder)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if name_or_path.endswith((".yaml", ".yml", ".json")) or os.path.sep in name_or_path:
        return load_model_config(name_or_path)
    raise UserError(f"unknown model preset '{name_or_path}' (known: {', '.join(PRESETS)}; or a path to a YAML file "
                    "or a Hugging Face config.json)")
