"""Hugging Face `config.json` files of the families H2's model implements, both ways.

`model_fields_from_hf` reads a Llama (2, 3, 3.1, 3.2: `rope_scaling` of type llama3, tied or untied
embeddings), Qwen2/Qwen2.5 (bias on q, k and v) or Mistral (without a sliding window) config into a
`ModelConfig`; a field H2 cannot honour is refused in one line naming the file and the field. Fields
that do not change the network (architectures, torch_dtype, token ids, transformers_version, ...)
are accepted and ignored. `hf_config_of` writes a `ModelConfig`'s fields back as its family's config (H2's
own presets as Llama). Pure Python: the planner reads these files without torch. Both directions speak in ModelConfig's
fields (a mapping), so that h2.core.model_config builds the config and this module needs no import of it.
"""

from __future__ import annotations

import json
import os

from h2.core.errors import UserError

# Each family's defaults for the fields a config.json may leave out (transformers' config classes).
FAMILY_DEFAULTS = {
    "llama": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048
    },
    "qwen2": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768
    },
    "mistral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32
    },
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
MOE_FIELDS = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts", "moe_intermediate_size",
              "n_shared_experts", "shared_expert_intermediate_size")
CONFIG_FILE = "config.json"


def is_hf_config_path(path: str) -> bool:
    """A `.json` file, or a folder holding a config.json (a Hugging Face model folder)."""
    return path.endswith(".json") or os.path.isfile(os.path.join(path, CONFIG_FILE))


def read_hf_config(path: str) -> tuple[str, dict]:
    """(the config file's path, its mapping); `path` is the file or its folder."""
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read it ({error})") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: malformed JSON (line {error.lineno}, column {error.colno}): {error.msg}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must be a JSON object, got {type(data).__name__}")
    return path, data


def model_fields_from_hf(data: dict, path: str) -> dict:
    """ModelConfig's fields for the Hugging Face config `data` (read from `path`)."""
    family = _family(data, path)
    _refuse_what_h2_cannot_honour(data, family, path)
    fields = {**FAMILY_DEFAULTS[family], **data}

    def integer(name: str) -> int:
        value = fields.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"{path}: field '{name}' must be a positive integer, got {value!r}")
        return value

    heads = integer("num_attention_heads")
    head_dim = fields.get("head_dim")
    if head_dim is not None:
        head_dim = integer("head_dim")
    kv_heads = integer("num_key_value_heads") if fields.get("num_key_value_heads") is not None else heads
    hidden = integer("hidden_size")
    config = dict(name=_name(path), family=family, vocab_size=integer("vocab_size"), hidden_size=hidden,
                  num_layers=integer("num_hidden_layers"), num_heads=heads, num_kv_heads=kv_heads,
                  intermediate_size=integer("intermediate_size"), max_seq_len=integer("max_position_embeddings"),
                  norm_eps=_number(fields, "rms_norm_eps", 1e-6, path), tie_embeddings=_flag(
                      fields, "tie_word_embeddings", False, path), init_std=_number(
                          fields, "initializer_range", 0.02,
                          path), attention_head_dim=None if head_dim in (None, hidden // heads) else head_dim)
    return config | _rope(data, fields, path)


def _name(path: str) -> str:
    """The model folder's name for its config.json (`Llama-3.2-1B/config.json`), else the file's stem."""
    path = os.path.abspath(path)
    if os.path.basename(path) == CONFIG_FILE:
        return os.path.basename(os.path.dirname(path)) or "hf-model"
    return os.path.splitext(os.path.basename(path))[0]


def _family(data: dict, path: str) -> str:
    family = data.get("model_type")
    if family not in FAMILY_DEFAULTS:
        raise UserError(f"{path}: field 'model_type': {family!r} is not a family H2 implements "
                        f"(supported: {', '.join(FAMILY_DEFAULTS)})")
    return family


def _number(fields: dict, name: str, default: float, path: str) -> float:
    value = fields.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{path}: field '{name}' must be a number, got {value!r}")
    return float(value)


def _flag(fields: dict, name: str, default: bool, path: str) -> bool:
    value = fields.get(name, default)
    if not isinstance(value, bool):
        raise UserError(f"{path}: field '{name}' must be true or false, got {value!r}")
    return value


def _refuse_what_h2_cannot_honour(data: dict, family: str, path: str) -> None:
    """One line for the first field that would change the network in a way H2's model does not."""
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{path}: field 'hidden_act': {act!r} is not supported (H2's MLP is SwiGLU with silu)")
    for name in MOE_FIELDS:
        if data.get(name):
            raise UserError(f"{path}: field '{name}': mixture-of-experts models are not supported")
    _refuse_sliding_window(data, family, path)
    for name in ("attention_bias", "mlp_bias"):
        if data.get(name):
            raise UserError(f"{path}: field '{name}': true is not supported (H2's {family} has no bias there)")
    if data.get("attention_dropout"):
        raise UserError(f"{path}: field 'attention_dropout': {data['attention_dropout']} is not supported "
                        "(H2 trains without dropout)")
    if data.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserError(f"{path}: field 'partial_rotary_factor': only 1.0 (rotary on the whole head) is supported")
    if data.get("quantization_config") is not None:
        raise UserError(f"{path}: field 'quantization_config': quantized models are not supported")


def _refuse_sliding_window(data: dict, family: str, path: str) -> None:
    if family == "qwen2":
        if data.get("use_sliding_window"):
            raise UserError(f"{path}: field 'use_sliding_window': sliding-window attention is not supported")
    elif data.get("sliding_window") is not None:
        raise UserError(f"{path}: field 'sliding_window': sliding-window attention is not supported "
                        f"(H2 implements {family} with full attention: sliding_window null)")
    layer_types = data.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise UserError(f"{path}: field 'layer_types': only full_attention layers are supported")


def _rope(data: dict, fields: dict, path: str) -> dict:
    """ModelConfig's rotary fields from `rope_parameters` (transformers 5) or `rope_scaling` and `rope_theta`."""
    name = "rope_parameters" if data.get("rope_parameters") is not None else "rope_scaling"
    rope = data.get(name) or {}
    if not isinstance(rope, dict):
        raise UserError(f"{path}: field '{name}' must be an object, got {rope!r}")
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", fields.get("rope_theta", 10000.0))
    result = {"rope_theta": _number({"rope_theta": theta}, "rope_theta", 10000.0, path)}
    if kind == "default":
        return result
    if kind != "llama3":
        raise UserError(f"{path}: field '{name}': rope type {kind!r} is not supported (only default and llama3)")
    missing = [key for key in ("factor", "low_freq_factor", "high_freq_factor") if key not in rope]
    if missing:
        raise UserError(f"{path}: field '{name}': llama3 rope needs '{missing[0]}'")
    original = rope.get("original_max_position_embeddings", fields.get("max_position_embeddings"))
    scaling = {
        "factor": rope["factor"], "low_freq_factor": rope["low_freq_factor"],
        "high_freq_factor": rope["high_freq_factor"]
    }
    for key, value in scaling.items():
        _number(scaling, key, 0.0, f"{path}: field '{name}'")
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
        raise UserError(f"{path}: field '{name}': original_max_position_embeddings must be a positive integer")
    return result | {
        "rope_scaling": "llama3", "rope_factor": float(scaling["factor"]), "rope_low_freq_factor": float(
            scaling["low_freq_factor"]), "rope_high_freq_factor": float(scaling["high_freq_factor"]),
        "rope_original_max_position": original
    }


def hf_config_of(fields: dict) -> dict:
    """A ModelConfig's `fields` (`to_dict()`) as its family's Hugging Face config.json (H2's own
    presets are written as Llama)."""
    family, hidden, heads = fields["family"], fields["hidden_size"], fields["num_heads"]
    data = {
        "architectures": [ARCHITECTURES[family]], "model_type": family, "vocab_size": fields["vocab_size"],
        "hidden_size": hidden, "intermediate_size": fields["intermediate_size"],
        "num_hidden_layers": fields["num_layers"], "num_attention_heads": heads,
        "num_key_value_heads": fields["num_kv_heads"], "head_dim": fields["attention_head_dim"] or hidden // heads,
        "hidden_act": "silu", "max_position_embeddings": fields["max_seq_len"], "rms_norm_eps": fields["norm_eps"],
        "rope_theta": fields["rope_theta"], "rope_scaling": _rope_scaling_of(fields),
        "tie_word_embeddings": fields["tie_embeddings"], "initializer_range": fields["init_std"],
        "torch_dtype": "float32", "use_cache": True
    }
    if family == "llama":
        data.update(attention_bias=False, mlp_bias=False)
    if family == "qwen2":
        data.update(use_sliding_window=False, sliding_window=None, max_window_layers=fields["num_layers"])
    if family == "mistral":
        data.update(sliding_window=None)
    return data


def _rope_scaling_of(fields: dict) -> dict | None:
    if fields["rope_scaling"] is None:
        return None
    return {
        "rope_type": "llama3", "factor": fields["rope_factor"], "low_freq_factor": fields["rope_low_freq_factor"],
        "high_freq_factor": fields["rope_high_freq_factor"],
        "original_max_position_embeddings": fields["rope_original_max_position"]
    }
