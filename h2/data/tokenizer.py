"""Tokenizers behind one interface: the byte tokenizer (the default, vocabulary 256), a Hugging Face
`tokenizer.json` (the `tokenizers` library) or a sentencepiece `.model` (the `sentencepiece` library).

Each has `.vocab_size`, `.eod_id` (the end-of-document token written after every document),
`.encode(str)`, `.encode_batch(list)`, `.decode(ids)`, `.fingerprint` (identifies exactly this
vocabulary), `.files` (what to copy beside an exported model) and `.save(dir)`. `train_bpe` trains a
byte-level BPE tokenizer on the user's own text with the `tokenizers` library (nothing is downloaded).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Iterable, Protocol

import numpy as np

from h2.core.errors import UserError

EOD_TOKEN = "<|endoftext|>"
# Tokens that end a document in the common vocabularies, in the order they are looked for.
EOD_CANDIDATES = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>")
HF_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"


class Tokenizer(Protocol):
    vocab_size: int
    eod_id: int
    fingerprint: str
    files: tuple[str, ...]

    def encode(self, text: str) -> np.ndarray:
        ...

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ...

    def decode(self, ids: Iterable[int]) -> str:
        ...

    def save(self, directory: str) -> list[str]:
        ...


def _copy_files(files: Iterable[str], directory: str, names: Iterable[str]) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    written = []
    for path, name in zip(files, names):
        target = os.path.join(directory, name)
        if os.path.abspath(path) != os.path.abspath(target):
            shutil.copyfile(path, target)
        written.append(target)
    return written


def _file_digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:16]


class ByteTokenizer:
    """Every UTF-8 byte is a token. Its end-of-document token is byte 0 (NUL), which text does not hold."""

    vocab_size = 256
    eod_id = 0
    fingerprint = "byte"
    files: tuple[str, ...] = ()
    kind = "byte"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(text) for text in texts]

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens if int(t) != self.eod_id).decode("utf-8", errors="replace")

    def save(self, directory: str) -> list[str]:
        return []  # nothing to keep: a run without tokenizer files trained on bytes (load_run_tokenizer)


class HFTokenizer:
    """A Hugging Face `tokenizer.json`, through the `tokenizers` library."""

    kind = "tokenizers"
    encodes_in_parallel = True  # encode_batch runs on every CPU (the library's own threads)

    def __init__(self, path: str):
        from tokenizers import Tokenizer as HF
        try:
            self.tokenizer = HF.from_file(path)
        except Exception as error:  # the library raises a bare Exception for a file that does not parse
            raise UserError(f"--tokenizer {path}: not a Hugging Face tokenizer.json ({_first_line(error)})") from None
        self.path = path
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod_id = self._find_eod()
        self.fingerprint = _file_digest(path)
        self.files = (path, )

    def _find_eod(self) -> int:
        for token in EOD_CANDIDATES:
            token_id = self.tokenizer.token_to_id(token)
            if token_id is not None:
                return token_id
        special = [t for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]
        if special:
            return self.tokenizer.token_to_id(special[0].content)
        raise UserError(f"--tokenizer {self.path}: no end-of-document token (none of {', '.join(EOD_CANDIDATES)}, "
                        f"and no special token)")

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False) if hasattr(
            self.tokenizer, "encode_batch_fast") else self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, directory: str) -> list[str]:
        return _copy_files(self.files, directory, (HF_FILE, ))


class SentencePieceTokenizer:
    """A sentencepiece `.model`."""

    kind = "sentencepiece"

    def __init__(self, path: str):
        import sentencepiece
        self.processor = sentencepiece.SentencePieceProcessor()
        try:
            self.processor.Load(path)
        except Exception as error:  # OSError or RuntimeError, by version
            raise UserError(f"--tokenizer {path}: not a sentencepiece model ({_first_line(error)})") from None
        self.path = path
        self.vocab_size = self.processor.GetPieceSize()
        self.eod_id = self.processor.eos_id()
        if self.eod_id < 0:
            raise UserError(f"--tokenizer {path}: the sentencepiece model has no end-of-sentence token (eos_id)")
        self.fingerprint = _file_digest(path)
        self.files = (path, )

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.processor.EncodeAsIds(text), dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int64) for ids in self.processor.EncodeAsIds(texts)]

    def decode(self, ids) -> str:
        return self.processor.DecodeIds([int(i) for i in ids if int(i) != self.eod_id])

    def save(self, directory: str) -> list[str]:
        return _copy_files(self.files, directory, (SENTENCEPIECE_FILE, ))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def load_tokenizer(path: str | None) -> ByteTokenizer | HFTokenizer | SentencePieceTokenizer:
    """The tokenizer at `path`: a tokenizer.json, a sentencepiece .model, or a folder holding one;
    None: the byte tokenizer."""
    if path is None or path == "byte":
        return ByteTokenizer()
    if os.path.isdir(path):
        for name in (HF_FILE, SENTENCEPIECE_FILE):
            if os.path.isfile(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name))
        raise UserError(f"--tokenizer {path}: the folder holds neither {HF_FILE} nor {SENTENCEPIECE_FILE}")
    if not os.path.isfile(path):
        raise UserError(f"--tokenizer {path}: no such file")
    if not os.access(path, os.R_OK):
        raise UserError(f"--tokenizer {path}: not readable")
    if path.endswith(".json"):
        return HFTokenizer(path)
    if path.endswith(".model"):
        return SentencePieceTokenizer(path)
    raise UserError(f"--tokenizer {path}: expected a Hugging Face tokenizer.json or a sentencepiece .model")


def check_vocabulary(tokenizer, vocab_size: int, model_name: str) -> None:
    """A token id must have an embedding row: the tokenizer's vocabulary must fit the model's."""
    if tokenizer.vocab_size > vocab_size:
        where = getattr(tokenizer, "path", tokenizer.kind)
        raise UserError(f"--tokenizer {where}: vocabulary of {tokenizer.vocab_size} tokens exceeds model "
                        f"'{model_name}' vocab_size {vocab_size}")


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str) -> str:
    """Train a byte-level BPE tokenizer (with the end-of-document token) on `texts`; writes and returns
    `out_dir`/tokenizer.json."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise UserError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least {len(alphabet) + 1} "
                        f"(its {len(alphabet)} bytes and the end-of-document token)")
    tokenizer = HF(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKEN], initial_alphabet=alphabet,
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, HF_FILE)
    tokenizer.save(path)
    return path
