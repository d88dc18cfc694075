"""`h2 export --run DIR --format hf --out OUT`: a run's newest checkpoint as a Hugging Face model folder.

Reads the checkpoint through `h2.train.checkpoint` (every parameter whole: tensor-parallel pieces and
stages put together, whatever strategy trained it) and writes OUT/config.json (the model's family;
H2's own presets as Llama), its weights as safetensors (h2.model.hf_weights: one file, or shards and
an index above --max-shard-size) and the run's tokenizer files when its options name a tokenizer
(the default byte tokenizer has none). `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads
the folder; `--init-from OUT` starts a run from it.
"""

from __future__ import annotations

import json
import os
import shutil

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def add_parser(sub) -> None:
    export = sub.add_parser("export", help="write a run's newest checkpoint as a Hugging Face model folder")
    export.add_argument("--run", required=True, metavar="DIR", help="the run's folder (its checkpoints/)")
    export.add_argument("--format", required=True, choices=["hf"], help="hf: config.json and model.safetensors")
    export.add_argument("--out", required=True, metavar="OUT", help="the folder to write (new or empty)")
    export.add_argument(
        "--max-shard-size", default="5GB", metavar="SIZE",
        help="above this size the weights are cut into numbered shards with an index "
        "(e.g. 500MB, 2GiB; default 5GB)")
    export.add_argument("--overwrite", action="store_true", help="replace the files of an OUT that is not empty")
    export.set_defaults(handler=run_export)


def run_export(args) -> int:
    from h2.model.hf_weights import hf_tensors, parse_size, write_safetensors  # torch: imported when run
    from h2.train.checkpoint import CheckpointDir
    max_shard_bytes = parse_size(args.max_shard_size)
    if not os.path.isdir(args.run):
        raise UserError(f"--run {args.run}: no such folder")
    _check_out(args.out, args.overwrite)
    checkpoint = CheckpointDir(args.run).load_latest()
    config = ModelConfig(**checkpoint.manifest["model_config"])
    parameters = _parameters(checkpoint, config)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config.to_hf_config(), handle, indent=2)
    files = write_safetensors(args.out, hf_tensors(config, parameters), max_shard_bytes)
    tokenizer = _copy_tokenizer(checkpoint.manifest, args.out)
    count = sum(tensor.numel() for tensor in parameters.values())
    print(f"exported {checkpoint.folder} (step {checkpoint.step}, model {config.name}, {count:,} parameters) "
          f"to {args.out} as {config.family}: config.json, {', '.join(files)}; {tokenizer}")
    return 0


def _check_out(out: str, overwrite: bool) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out}: exists and is not a folder")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise UserError(f"--out {out}: not empty (give --overwrite to replace its files)")


def _parameters(checkpoint, config: ModelConfig) -> dict:
    """Every parameter of the model, whole, by h2 name, checked against the model's shapes."""
    from h2.model.hf_weights import parameter_shapes
    parameters = {}
    for name, shape in parameter_shapes(config).items():
        tensor = checkpoint.parameter(name)
        if tuple(tensor.shape) != shape:
            raise UserError(f"{checkpoint.folder}: parameter '{name}' has shape {list(tensor.shape)}, model "
                            f"'{config.name}' has {list(shape)}")
        parameters[name] = tensor
    return parameters


def _tokenizer_path(manifest: dict) -> str | None:
    """The tokenizer the run's options name (a tokenizer.json, a sentencepiece .model, or a folder of them)."""
    for options in (manifest.get("train_config") or {}, manifest.get("data") or {}, manifest):
        path = options.get("tokenizer") if isinstance(options, dict) else None
        if isinstance(path, str) and path:
            return path
    return None


def _copy_tokenizer(manifest: dict, out: str) -> str:
    """Copy the run's tokenizer files into `out`; says what it copied."""
    path = _tokenizer_path(manifest)
    if path is None:
        return "no tokenizer files (the run used the byte tokenizer, which has none)"
    if os.path.isdir(path):
        sources = [os.path.join(path, name) for name in TOKENIZER_FILES if os.path.isfile(os.path.join(path, name))]
        copied = [(source, os.path.basename(source)) for source in sources]
    elif path.endswith(".model"):
        copied = [(path, "tokenizer.model")]
    else:
        copied = [(path, "tokenizer.json")]
    for source, name in copied:
        try:
            shutil.copyfile(source, os.path.join(out, name))
        except OSError as error:
            raise UserError(f"tokenizer {source}: cannot copy it ({error.strerror})") from None
    if not copied:
        return f"no tokenizer files found in {path}"
    return "tokenizer " + ", ".join(name for _, name in copied)
