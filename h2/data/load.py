"""`load_data`: the training stream, the held-out validation stream and the tokenizer of a run.

The data is one of: the embedded standard-library corpus (no `--data`, the byte tokenizer), a
prepared folder (`--data DIR` holding an index, h2.data.prepare), or the user's files, tokenized on the
fly: into `<cache_dir>/<fingerprint>/` (the run's `data_cache/`) above IN_MEMORY_BYTES of text, in
memory below it. The last `validation_fraction` of the tokens (at least one sequence), moved back to
the start of the document it cuts where that leaves a training sequence, is held out for validation.
Every check (paths, fields, the tokenizer's file, its vocabulary against the model's) is made before
any tokenizing.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple

import numpy as np

from h2.core.errors import UserError
from h2.data.corpus import Corpus, load_stdlib_corpus
from h2.data.prepare import (
    data_fingerprint,
    default_workers,
    encode_in_memory,
    is_prepared,
    open_prepared,
    prepare,
)
from h2.data.sources import resolve_source
from h2.data.stream import SequenceStream
from h2.data.tokenizer import ByteTokenizer, check_vocabulary, load_tokenizer

IN_MEMORY_BYTES = 8 * 2**20
DEFAULT_VALIDATION_FRACTION = 0.01
VALIDATION_SEED = 0  # the validation stream's order: the same for every run on the same text, whatever its seed


class LoadedData(NamedTuple):
    train: SequenceStream
    validation: SequenceStream
    tokenizer: object


def _prepared_tokenizer_path(folder: str, index: dict) -> str | None:
    files = index["tokenizer"]["files"]
    return os.path.join(folder, files[0]) if files else None


def _pick_tokenizer(data: str | None, tokenizer: str | None):
    """(tokenizer path, tokenizer): a prepared folder brings its own; --tokenizer must then match it."""
    if data is not None and is_prepared(data):
        index = open_prepared(data).index
        own_path = _prepared_tokenizer_path(data, index)
        own = load_tokenizer(own_path)
        if tokenizer is not None and load_tokenizer(tokenizer).fingerprint != own.fingerprint:
            raise UserError(f"--tokenizer {tokenizer}: differs from the tokenizer {data} was prepared with "
                            f"({own_path or 'byte'})")
        return own_path, own
    return tokenizer, load_tokenizer(tokenizer)


def split_point(total: int, document_starts: np.ndarray | None, fraction: float, seq_len: int, where: str) -> int:
    """Where the validation tokens start (see the module docstring)."""
    need = seq_len + 1
    held = max(math.ceil(total * fraction), need)
    if total - held < need:
        raise UserError(f"{where}: {total} tokens are too few for a training and a validation sequence of "
                        f"{need} tokens each (seq_len {seq_len})")
    cut = total - held
    if document_starts is not None and len(document_starts) > 1:
        document_start = int(document_starts[np.searchsorted(document_starts, cut, side="right") - 1])
        if document_start >= need:
            cut = document_start
    return cut


def _view(tokens, start: int, stop: int):
    """Tokens [start, stop) without copying: an array's slice, or a lazy range of memory-mapped shards."""
    return tokens[start:stop] if isinstance(tokens, np.ndarray) else tokens.view(start, stop)


def _split(tokens, document_starts, fingerprint: str, source: str, fraction: float, seq_len: int,
           where: str) -> tuple[Corpus, Corpus]:
    total = len(tokens)
    cut = split_point(total, document_starts, fraction, seq_len, where)
    return (Corpus(_view(tokens, 0, cut), f"{fingerprint}:train@{cut}", source),
            Corpus(_view(tokens, cut, total), f"{fingerprint}:validation@{cut}", source))


def _user_tokens(data: str, data_field: str, tokenizer_path: str | None, tokenizer, cache_dir: str | None,
                 workers: int | None, progress: bool):
    """(tokens, document starts, fingerprint) of the user's files: prepared, cached or in memory."""
    if is_prepared(data):
        prepared = open_prepared(data)
        return prepared.tokens, prepared.document_starts, prepared.index["fingerprint"]
    source = resolve_source(data, data_field)
    folder = _cache_folder(source, tokenizer, tokenizer_path, cache_dir, workers, progress)
    if folder is None:
        tokens, starts = encode_in_memory(source, tokenizer, tokenizer_path, workers=1)
        return tokens, starts, data_fingerprint(tokenizer.fingerprint, source.fingerprint())
    prepared = open_prepared(folder)
    return prepared.tokens, prepared.document_starts, prepared.index["fingerprint"]


def _cache_folder(source, tokenizer, tokenizer_path: str | None, cache_dir: str | None, workers: int | None,
                  progress: bool) -> str | None:
    """The prepared folder of `source` in `cache_dir`, prepared now unless there; None: small enough
    (or no cache) to tokenize in memory."""
    if cache_dir is None or source.total_bytes <= IN_MEMORY_BYTES:
        return None
    folder = os.path.join(cache_dir, data_fingerprint(tokenizer.fingerprint, source.fingerprint()))
    if not is_prepared(folder):
        prepare(source, tokenizer_path, folder, workers=workers, progress=progress, reuse_existing=True)
    return folder


def prepare_data_cache(config, cache_dir: str, progress: bool = True) -> None:
    """Tokenize `config`'s data (h2.core.training.TrainConfig) into `cache_dir` where a trainer would,
    so that the processes of one job, started after this, find it prepared."""
    if config.data is None or is_prepared(config.data):
        return
    tokenizer_path, tokenizer = _pick_tokenizer(config.data, config.tokenizer)
    source = resolve_source(config.data, config.data_field)
    _cache_folder(source, tokenizer, tokenizer_path, cache_dir, default_workers(), progress)


def _checked_tokenizer(data: str | None, tokenizer: str | None, validation_fraction: float, vocab_size: int | None,
                       model_name: str):
    """(tokenizer path, tokenizer) once every option that needs no tokenizing is checked."""
    if not 0 < validation_fraction < 1:
        raise UserError(f"--validation-fraction must be in (0, 1), got {validation_fraction}")
    tokenizer_path, chosen = _pick_tokenizer(data, tokenizer)
    if vocab_size is not None:
        check_vocabulary(chosen, vocab_size, model_name)
    if data is None and not isinstance(chosen, ByteTokenizer):
        raise UserError(f"--tokenizer {tokenizer}: give --data too (the embedded corpus is byte-tokenized)")
    return tokenizer_path, chosen


def check_data_options(config, model_config) -> None:
    """Every refusal `load_training_data` would make before tokenizing, without tokenizing: for a
    launcher that starts the processes which load the data."""
    _checked_tokenizer(config.data, config.tokenizer, config.validation_fraction, model_config.vocab_size,
                       model_config.name)
    if config.data is not None and not is_prepared(config.data):
        resolve_source(config.data, config.data_field)


def load_data(data: str | None = None, *, tokenizer: str | None = None, data_field: str = "text",
              validation_fraction: float = DEFAULT_VALIDATION_FRACTION, seq_len: int, seed: int = 0,
              vocab_size: int | None = None, model_name: str = "model", cache_dir: str | None = None,
              corpus: Corpus | None = None, workers: int | None = None, progress: bool = False) -> LoadedData:
    """The run's (training stream, validation stream, tokenizer); `vocab_size`: the model's, which the
    tokenizer's vocabulary must not exceed; `corpus`: byte tokens given directly (the Python API)."""
    tokenizer_path, chosen = _checked_tokenizer(data, tokenizer, validation_fraction, vocab_size, model_name)
    if data is None:
        corpus = corpus or load_stdlib_corpus()
        tokens, starts, fingerprint, where = corpus.tokens, None, corpus.fingerprint, "the embedded corpus"
    else:
        tokens, starts, fingerprint = _user_tokens(data, data_field, tokenizer_path, chosen, cache_dir, workers,
                                                   progress)
        where = f"--data {data}"
    train, validation = _split(tokens, starts, fingerprint, corpus.source if data is None else data,
                               validation_fraction, seq_len, where)
    return LoadedData(SequenceStream(train, seq_len, seed=seed),
                      SequenceStream(validation, seq_len, seed=VALIDATION_SEED), chosen)


def load_training_data(config, model_config, *, seq_len: int | None = None, cache_dir: str | None = None,
                       corpus: Corpus | None = None, progress: bool = False) -> LoadedData:
    """`load_data` for a trainer: the data options of `config` (h2.core.training.TrainConfig) and the
    vocabulary of `model_config`."""
    return load_data(config.data, tokenizer=config.tokenizer, data_field=config.data_field,
                     validation_fraction=config.validation_fraction, seq_len=seq_len or config.seq_len,
                     seed=config.seed, vocab_size=model_config.vocab_size, model_name=model_config.name,
                     cache_dir=cache_dir, corpus=corpus, workers=default_workers(), progress=progress)


DATA_OPTIONS = ("data", "data_field", "tokenizer", "validation_fraction")


def adopt_data_options(config, checkpoint_train_config: dict | None, explicit: frozenset[str]):
    """A resumed run reads the data its checkpoint read: the data options not given explicitly are the
    checkpoint's (a different text is still refused by the stream's fingerprint)."""
    if not checkpoint_train_config:
        return config
    saved = {
        name: checkpoint_train_config[name] for name in DATA_OPTIONS
        if name in checkpoint_train_config and name not in explicit
    }
    return dataclasses.replace(config, **saved)


RUN_TOKENIZER = "tokenizer"


def save_run_tokenizer(tokenizer, out_dir: str) -> list[str]:
    """Copy the run's tokenizer files into `<out_dir>/tokenizer/` (none for the byte tokenizer), so that
    generating from and exporting a run do not depend on where the tokenizer was."""
    return tokenizer.save(os.path.join(out_dir, RUN_TOKENIZER))


def load_run_tokenizer(out_dir: str):
    """The tokenizer a run in `out_dir` trained with (`save_run_tokenizer`): bytes when it kept no file."""
    folder = os.path.join(out_dir, RUN_TOKENIZER)
    if os.path.isdir(folder) and os.listdir(folder):
        return load_tokenizer(folder)
    return ByteTokenizer()
