"""Training data: tokenizers (bytes by default, a Hugging Face tokenizer.json or a sentencepiece model),
the user's text (txt, jsonl/json, parquet, datasets folders) tokenized into memory-mapped shards with an
index (`h2 data prepare`), and the embedded corpus of the Python standard library's own sources,
served as fixed-length sequences with deterministic sharding by data-parallel rank, a resumable
position and a held-out validation split (`load_data`). Imports only h2.core beside torch, numpy and the
data libraries."""

from h2.data.corpus import Corpus, load_stdlib_corpus
from h2.data.load import (
    LoadedData,
    adopt_data_options,
    check_data_options,
    load_data,
    load_run_tokenizer,
    load_training_data,
    prepare_data_cache,
    save_run_tokenizer,
)
from h2.data.stream import SequenceStream
from h2.data.tokenizer import ByteTokenizer, load_tokenizer

__all__ = [
    "ByteTokenizer", "Corpus", "LoadedData", "adopt_data_options", "check_data_options", "load_data",
    "load_run_tokenizer", "save_run_tokenizer", "load_stdlib_corpus", "load_tokenizer", "load_training_data",
    "prepare_data_cache", "SequenceStream"
]
