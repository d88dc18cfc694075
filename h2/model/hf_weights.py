"""The h2 model's weights as a Hugging Face model folder, both ways: names, rotary layout, safetensors files.

Names: `embed.weight` is `model.embed_tokens.weight`, `layers.N.attn.q_proj.weight` is
`model.layers.N.self_attn.q_proj.weight`, the two norms of a layer are `input_layernorm` and
`post_attention_layernorm`, `norm.weight` is `model.norm.weight` and `head.weight` is
`lm_head.weight` (left out when tied to the embedding, as Hugging Face saves tied models).

Rotary layout: h2 rotates the pairs (x[2i], x[2i+1]) of a head, Hugging Face's Llama-family models
the pairs (x[i], x[i + head_dim/2]) (`rotate_half`). Attention scores only see q.k, so permuting the
output rows of q and k (and their biases) the same way inside every head turns one model into the
other exactly: `to_hf_layout` on export, `from_hf_layout` on import.

Files: `model.safetensors`, or above `max_shard_bytes` the shards `model-00001-of-0000N.safetensors`
with `model.safetensors.index.json`, written and read through the `safetensors` library only. A
folder holding only a pickle (`pytorch_model.bin`) is refused: nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import re

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin", "model.pt")
_LAYER_PARTS = {
    "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
    "attn.o_proj": "self_attn.o_proj", "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
    "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"
}
_TOP = {
    "embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight", "head.weight": "lm_head.weight"
}
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)")


# ---- names --------------------------------------------------------------------------------------
def hf_name(name: str) -> str:
    """The Hugging Face name of the h2 parameter `name`."""
    if name in _TOP:
        return _TOP[name]
    match = _LAYER_NAME.fullmatch(name)
    assert match and match.group(2) in _LAYER_PARTS, f"an h2 model parameter: {name}"
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_PARTS[part]}.{kind}"


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the h2 model of `config` (a tied head counted once, as `embed.weight`), by name."""
    from h2.model.transformer import Transformer
    with torch.device("meta"):
        model = Transformer(config)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


# ---- rotary layout ------------------------------------------------------------------------------
def _is_rotated(name: str) -> bool:
    return name.endswith(("attn.q_proj.weight", "attn.q_proj.bias", "attn.k_proj.weight", "attn.k_proj.bias"))


def to_hf_layout(tensor: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of every head reordered from h2's interleaved pairs to Hugging Face's halves: 0, 2, 4, ..., 1, 3, ..."""
    rest = tensor.shape[1:]
    return tensor.reshape(-1, head_dim // 2, 2, *rest).transpose(1, 2).reshape(tensor.shape).contiguous()


def from_hf_layout(tensor: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The inverse of `to_hf_layout`."""
    rest = tensor.shape[1:]
    return tensor.reshape(-1, 2, head_dim // 2, *rest).transpose(1, 2).reshape(tensor.shape).contiguous()


def hf_tensors(config: ModelConfig, parameters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The h2 model's `parameters` (whole, by h2 name) as Hugging Face tensors by Hugging Face name."""
    tensors = {}
    for name, tensor in parameters.items():
        tensor = tensor.detach().to("cpu")
        tensors[hf_name(name)] = to_hf_layout(tensor, config.head_dim) if _is_rotated(name) else tensor.contiguous()
    return tensors


def h2_parameters(config: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Hugging Face `tensors` as the h2 model's parameters by h2 name; every parameter present with its
    shape, or one line naming what does not fit."""
    parameters = {}
    for name, shape in parameter_shapes(config).items():
        tensor = tensors.get(hf_name(name))
        if tensor is None:
            raise UserError(f"{source}: no tensor '{hf_name(name)}' (model '{config.name}' needs it)")
        if tuple(tensor.shape) != shape:
            raise UserError(f"{source}: tensor '{hf_name(name)}' has shape {list(tensor.shape)}, model "
                            f"'{config.name}' needs {list(shape)}")
        tensor = tensor.to(torch.float32)
        parameters[name] = from_hf_layout(tensor, config.head_dim) if _is_rotated(name) else tensor
    return parameters


# ---- files --------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """Bytes of a size such as 5GB, 500MB, 2GiB or 1000000 (Hugging Face's --max-shard-size spelling)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise UserError(f"--max-shard-size: expected a size such as 5GB, 500MB or 1000000, got {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    powers = {
        "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
        "TIB": 2**40
    }
    size = int(number * powers[unit])
    if size < 1:
        raise UserError(f"--max-shard-size must be at least 1 byte, got {text!r}")
    return size


def _shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Names in order, cut into consecutive groups of at most `max_shard_bytes` (a larger tensor alone)."""
    shards, current, size = [], [], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    return shards + [current] if current else shards


def write_safetensors(folder: str, tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[str]:
    """`tensors` as model.safetensors, or as numbered shards with their index; returns the files written."""
    groups = _shards(tensors, max_shard_bytes)
    metadata = {"format": "pt"}
    if len(groups) == 1:
        save_file(tensors, os.path.join(folder, SINGLE_FILE), metadata=metadata)
        return [SINGLE_FILE]
    files, weight_map = [], {}
    for index, names in enumerate(groups, start=1):
        file = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: tensors[name] for name in names}, os.path.join(folder, file), metadata=metadata)
        files.append(file)
        weight_map.update(dict.fromkeys(names, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(folder, INDEX_FILE), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=2)
    return files + [INDEX_FILE]


def safetensors_files(folder: str) -> list[str]:
    """The weight files of a Hugging Face model folder: model.safetensors, or the shards its index names.
    A folder with only pickled weights (pytorch_model.bin) is refused, as is one without weights."""
    if os.path.isfile(os.path.join(folder, SINGLE_FILE)):
        return [os.path.join(folder, SINGLE_FILE)]
    index = os.path.join(folder, INDEX_FILE)
    if os.path.isfile(index):
        return [os.path.join(folder, file) for file in sorted(set(_weight_map(index).values()))]
    pickles = [name for name in PICKLES if os.path.exists(os.path.join(folder, name))]
    if pickles:
        raise UserError(f"{os.path.join(folder, pickles[0])}: a pickled checkpoint is refused (loading it could run "
                        "code); convert it to safetensors")
    raise UserError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")


def _weight_map(index: str) -> dict[str, str]:
    try:
        with open(index, encoding="utf-8") as handle:
            weight_map = json.load(handle).get("weight_map")
    except (OSError, ValueError, AttributeError) as error:
        raise UserError(f"{index}: unreadable index ({error})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) and "/" not in f for f in weight_map.values()):
        raise UserError(f"{index}: field 'weight_map' must map tensor names to file names in the folder")
    return weight_map


def read_safetensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model folder, by name (on the CPU)."""
    tensors = {}
    for path in safetensors_files(folder):
        try:
            with safe_open(path, framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    tensors[name] = handle.get_tensor(name)
        except FileNotFoundError:
            raise UserError(f"{path}: named by {INDEX_FILE} but missing") from None
        except (SafetensorError, OSError, ValueError) as error:
            raise UserError(f"{path}: not a readable safetensors file ({error})") from None
    return tensors


def load_hf_parameters(config: ModelConfig, folder: str) -> dict[str, torch.Tensor]:
    """The h2 model's parameters (by h2 name, fp32) read from the Hugging Face model folder `folder`."""
    return h2_parameters(config, read_safetensors(folder), folder)


@torch.no_grad()
def copy_into(model: torch.nn.Module, parameters: dict[str, torch.Tensor]) -> None:
    """Copy `parameters` (by h2 name, whole) into a whole h2 `Transformer`."""
    for name, param in model.named_parameters():
        param.copy_(parameters[name])


def check_init_from(config: ModelConfig, folder: str, flag: str = "--init-from") -> None:
    """Before any work: `folder` is a Hugging Face model folder whose config.json describes the same
    network as `config` and whose safetensors hold every parameter with its shape (nothing is read
    but headers)."""
    from h2.core.model_config import load_hf_model_config
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {folder}: not a folder (expected a Hugging Face model folder)")
    files = safetensors_files(folder)
    theirs = load_hf_model_config(folder)
    difference = first_difference(config.architecture(), theirs.architecture())
    if difference:
        raise UserError(f"{flag} {folder}: its config.json does not match model '{config.name}' ({difference})")
    shapes = {}
    for path in files:
        try:
            with safe_open(path, framework="pt", device="cpu") as handle:
                shapes.update({name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()})
        except FileNotFoundError:
            raise UserError(f"{path}: named by {INDEX_FILE} but missing") from None
        except (SafetensorError, OSError, ValueError) as error:
            raise UserError(f"{path}: not a readable safetensors file ({error})") from None
    for name, shape in parameter_shapes(config).items():
        if shapes.get(hf_name(name)) != shape:
            found = "missing" if hf_name(name) not in shapes else f"shape {list(shapes[hf_name(name)])}"
            raise UserError(f"{flag} {folder}: tensor '{hf_name(name)}' is {found}, model '{config.name}' "
                            f"needs shape {list(shape)}")


def first_difference(ours: dict, theirs: dict) -> str | None:
    """'field: ours vs theirs' for the first field two configs' mappings disagree on, else None."""
    for name in ours:
        if ours[name] != theirs.get(name):
            return f"{name}: {ours[name]!r} vs {theirs.get(name)!r} in config.json"
    return None
