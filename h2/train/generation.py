"""Text from a trained run: its newest checkpoint as the single-device model, the tokenizer it trained
with, and decoding (greedy, or top-k sampling at a temperature from a seeded generator).

The model is rebuilt from the checkpoint's manifest (its model configuration) and every parameter is
read whole (`Checkpoint.parameter`: TP pieces and pipeline stages assembled), so a single-device run and
a pipeline run of any strategy give the same model. Decoding runs the whole window again for each new
token (the model has no key/value cache); a window longer than the model's context keeps its last
`max_seq_len` tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from h2.core.errors import UserError
from h2.core.model_config import ModelConfig
from h2.data import ByteTokenizer
from h2.model.transformer import Transformer
from h2.train.checkpoint import CheckpointDir

MAX_NEW_TOKENS = 100_000


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: temperature 0 is greedy (the most likely token); otherwise a draw
    from the softmax of logits / temperature over the `top_k` most likely tokens (all when None)."""
    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0


def load_run_model(run_dir: str) -> tuple[Transformer, dict]:
    """The model of `run_dir`'s newest checkpoint (fp32, CPU, eval mode) and the checkpoint's manifest."""
    if not os.path.isdir(run_dir):
        raise UserError(f"--run {run_dir}: no such run folder")
    checkpoints = CheckpointDir(run_dir)
    if not checkpoints.complete_steps():
        raise UserError(f"--run {run_dir}: no checkpoint (train it first, h2 train --out {run_dir})")
    checkpoint = checkpoints.load_latest()
    model = Transformer(ModelConfig(**checkpoint.manifest["model_config"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(checkpoint.parameter(name))
    return model.eval(), checkpoint.manifest


def run_tokenizer(manifest: dict):
    """The tokenizer the run trained with: the one its options name (`tokenizer`: a Hugging Face
    tokenizer.json or a sentencepiece .model), the byte tokenizer otherwise. The one place `h2 generate`
    finds it."""
    path = manifest.get("tokenizer") or (manifest.get("train_config") or {}).get("tokenizer")
    if path is None:
        return ByteTokenizer()
    if not os.path.isfile(path):
        raise UserError(f"the run's tokenizer '{path}' is not a file")
    if path.endswith(".model"):
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=path)
        return _Tokenizer(processor.encode, processor.decode)
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(path)
    return _Tokenizer(lambda text: tokenizer.encode(text).ids, tokenizer.decode)


@dataclass(frozen=True)
class _Tokenizer:
    """A library's tokenizer as the byte tokenizer's interface: encode(str) -> ids, decode(ids) -> str."""
    encode: object
    decode: object


def check_request(model: Transformer, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling) -> None:
    """Refuse, in one line, a request the model cannot serve."""
    context = model.config.max_seq_len
    if not prompt_ids:
        raise UserError("--prompt is empty (give at least one character)")
    if len(prompt_ids) > context:
        raise UserError(f"--prompt is {len(prompt_ids)} tokens, longer than the model's context of {context}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS}, got {max_new_tokens}")
    if not sampling.temperature >= 0:
        raise UserError(f"--temperature must be 0 (greedy) or positive, got {sampling.temperature}")
    if sampling.top_k is not None and not 1 <= sampling.top_k <= model.config.vocab_size:
        raise UserError(f"--top-k must be between 1 and the vocabulary size {model.config.vocab_size}, "
                        f"got {sampling.top_k}")


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The token chosen from the last position's `logits` [vocab]."""
    if sampling.temperature == 0:
        return int(logits.argmax())
    scaled = logits.float() / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))


@torch.no_grad()
def generate(model: Transformer, prompt_ids: list[int], max_new_tokens: int,
             sampling: Sampling = Sampling()) -> list[int]:
    """The `max_new_tokens` tokens that follow `prompt_ids`."""
    check_request(model, prompt_ids, max_new_tokens, sampling)
    generator = torch.Generator().manual_seed(sampling.seed)
    tokens = list(prompt_ids)
    for _ in range(max_new_tokens):
        window = torch.tensor([tokens[-model.config.max_seq_len:]], dtype=torch.long)
        tokens.append(next_token(model(window)[0, -1], sampling, generator))
    return tokens[len(prompt_ids):]
