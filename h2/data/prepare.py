"""Tokenize a data source once into memory-mapped token shards with an index (`h2 data prepare`).

A prepared folder holds:
    index.json          {"format": "h2-tokens", "version": 1, "dtype": "uint16" | "uint32",
                         "fingerprint": data fingerprint (tokenizer + source),
                         "tokenizer": {"kind", "fingerprint", "vocab_size", "eod_id", "files"},
                         "source": {"spec", "kind", "field", "fingerprint", "files"},
                         "tokens": total, "documents": total,
                         "shards": [{"file", "tokens", "documents", "first_document"}],
                         "document_starts": "documents.npy"}
    shard_NNNNN.bin     the tokens, raw little-endian (numpy memmap), every document followed by the
                        end-of-document token; a document never straddles two shards
    documents.npy       int64 [documents + 1]: where each document starts in the concatenated tokens
    tokenizer/          the tokenizer's files, so the folder is self-contained

Tokens are uint16 when the vocabulary fits (<= 65535 ids) else uint32. Documents are tokenized in
batches by a pool of processes, in order, so the result does not depend on the pool's size. The
index is written last, into a folder renamed into place: a folder with an index is complete.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from h2.core.errors import UserError
from h2.data.sources import DataSource
from h2.data.tokenizer import load_tokenizer

FORMAT, VERSION = "h2-tokens", 1
INDEX = "index.json"
DOCUMENTS = "documents.npy"
DEFAULT_SHARD_TOKENS = 1 << 26
BATCH_DOCUMENTS = 4096
BATCH_CHARS = 4 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def data_fingerprint(tokenizer_fingerprint: str, source_fingerprint: str) -> str:
    return hashlib.sha256(
        f"{FORMAT}-{VERSION}\0{tokenizer_fingerprint}\0{source_fingerprint}".encode()).hexdigest()[:16]


# ---- tokenizing in worker processes ---------------------------------------------------------------
_WORKER_TOKENIZER = None


def _init_worker(tokenizer_path: str | None) -> None:
    global _WORKER_TOKENIZER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER_TOKENIZER = load_tokenizer(tokenizer_path)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One batch's tokens, flat in the shards' dtype, and each document's length: little to pickle back."""
    encoded = _WORKER_TOKENIZER.encode_batch(texts)
    flat = np.concatenate(encoded) if encoded else np.empty(0, dtype=np.int64)
    return flat.astype(token_dtype(_WORKER_TOKENIZER.vocab_size)), np.array([len(e) for e in encoded], dtype=np.int64)


def _unpacked(packed: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    flat, lengths = packed
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


def _batches(documents: Iterator[str]) -> Iterator[list[str]]:
    batch, chars = [], 0
    for text in documents:
        batch.append(text)
        chars += len(text)
        if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def encoded_batches(source: DataSource, tokenizer, tokenizer_path: str | None,
                    workers: int) -> Iterator[list[np.ndarray]]:
    """Every document's tokens, batch by batch in document order. A tokenizer whose library encodes a
    batch on every CPU itself (the `tokenizers` library) does so here while a thread reads the next
    batches; the others are spread over a pool of `workers` processes."""
    if getattr(tokenizer, "encodes_in_parallel", False):
        yield from _encoded_reading_ahead(source, tokenizer)
        return
    if workers <= 1:
        for batch in _batches(source.documents()):
            yield tokenizer.encode_batch(batch)
        return
    # fork is quick, but not from a process with other threads (a pipeline rank's watchdog and gloo)
    forkable = sys.platform.startswith("linux") and threading.active_count() == 1
    context = multiprocessing.get_context("fork" if forkable else "spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(tokenizer_path, )) as pool:
        for packed in pool.imap(_encode_in_worker, _batches(source.documents()), chunksize=1):
            yield _unpacked(packed)


_END = object()


def _encoded_reading_ahead(source: DataSource, tokenizer) -> Iterator[list[np.ndarray]]:
    """Encode batch by batch while a thread reads and parses the next ones (the library releases the
    GIL while it encodes); an error while reading is raised here."""
    batches: queue.Queue = queue.Queue(maxsize=4)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in _batches(source.documents()):
                if not put(batch):
                    return
            put(_END)
        except BaseException as error:  # handed to the consumer, which raises it
            put(error)

    reader = threading.Thread(target=read, name="h2-data-reader", daemon=True)
    reader.start()
    try:
        while (item := batches.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield tokenizer.encode_batch(item)
    finally:
        stop.set()
        reader.join(timeout=5)


# ---- writing a prepared folder --------------------------------------------------------------------
class _ShardWriter:

    def __init__(self, folder: str, dtype: np.dtype, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = folder, dtype, shard_tokens
        self.shards: list[dict] = []
        self.document_starts = [0]
        self.handle = None
        self.total = 0

    def _open(self) -> None:
        name = f"shard_{len(self.shards):05d}.bin"
        self.handle = open(os.path.join(self.folder, name), "wb")
        self.shards.append({"file": name, "tokens": 0, "documents": 0, "first_document": len(self.document_starts) - 1})

    def add(self, documents: list[np.ndarray], eod_id: int) -> None:
        eod = np.array([eod_id], dtype=self.dtype)
        pieces = []
        for ids in documents:
            if self.handle is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._flush(pieces)
                pieces = []
                self._close()
                self._open()
            pieces.append(ids.astype(self.dtype, copy=False))
            pieces.append(eod)
            length = len(ids) + 1
            self.shards[-1]["tokens"] += length
            self.shards[-1]["documents"] += 1
            self.total += length
            self.document_starts.append(self.total)
        self._flush(pieces)

    def _flush(self, pieces: list[np.ndarray]) -> None:
        if pieces:
            self.handle.write(np.concatenate(pieces).tobytes())

    def _close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def prepare(source: DataSource, tokenizer_path: str | None, out_dir: str, *, workers: int | None = None,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, progress: bool = True, overwrite: bool = False,
            reuse_existing: bool = False) -> dict:
    """Tokenize `source` into `out_dir` (which must not hold a prepared folder unless `overwrite`);
    returns the index. `reuse_existing`: a cache keyed by fingerprint, where a folder another process
    completed meanwhile holds the same tokens and is kept."""
    tokenizer = load_tokenizer(tokenizer_path)
    if os.path.exists(os.path.join(out_dir, INDEX)) and not overwrite:
        raise UserError(f"--out {out_dir}: already holds prepared data ({INDEX}); pass --overwrite to replace it")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out {out_dir}: exists and is not a folder")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.tmp-{os.getpid()}-", dir=parent)
    try:
        index = _write_prepared(source, tokenizer, tokenizer_path, staging, workers or default_workers(), shard_tokens,
                                progress)
        if reuse_existing and is_prepared(out_dir):
            return open_prepared(out_dir).index
        if os.path.isdir(out_dir):
            if not overwrite and os.listdir(out_dir):
                raise UserError(f"--out {out_dir}: a folder that is not empty; pass --overwrite to replace it")
            shutil.rmtree(out_dir)
        try:
            os.rename(staging, out_dir)
        except OSError:
            if not os.path.exists(os.path.join(out_dir, INDEX)):  # another process won the race with the same data
                raise
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return index


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _progress_bar(total_bytes: int, enabled: bool, what: str):
    from tqdm import tqdm
    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=what, disable=not enabled, file=sys.stderr,
                mininterval=1.0)


def _write_prepared(source: DataSource, tokenizer, tokenizer_path: str | None, folder: str, workers: int,
                    shard_tokens: int, progress: bool) -> dict:
    dtype = token_dtype(tokenizer.vocab_size)
    writer = _ShardWriter(folder, dtype, shard_tokens)
    source_fingerprint = source.fingerprint()
    with _progress_bar(source.total_bytes, progress, f"tokenizing {source.spec}") as bar:
        for encoded in encoded_batches(source, tokenizer, tokenizer_path, workers):
            _check_ids(encoded, tokenizer, source.spec)
            writer.add(encoded, tokenizer.eod_id)
            bar.update(sum(len(e) for e in encoded) * _BYTES_PER_TOKEN_GUESS)
        bar.update(max(0, bar.total - bar.n))
    writer._close()
    if writer.total == 0:
        raise UserError(f"--data {source.spec}: empty dataset (no document)")
    np.save(os.path.join(folder, DOCUMENTS), np.asarray(writer.document_starts, dtype=np.int64))
    tokenizer_files = [os.path.relpath(p, folder) for p in tokenizer.save(os.path.join(folder, "tokenizer"))]
    index = {
        "format": FORMAT, "version": VERSION, "dtype": dtype.name, "fingerprint": data_fingerprint(
            tokenizer.fingerprint, source_fingerprint), "tokenizer": {
                "kind": tokenizer.kind, "fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                "eod_id": tokenizer.eod_id, "files": tokenizer_files
            }, "source": {
                "spec": source.spec, "kind": source.kind, "field": source.field, "fingerprint": source_fingerprint,
                "files": [os.path.abspath(p) for p in source.paths]
            }, "tokens": writer.total, "documents": len(writer.document_starts) - 1, "shards": writer.shards,
        "document_starts": DOCUMENTS
    }
    with open(os.path.join(folder, INDEX), "w", encoding="utf-8") as handle:
        json.dump(index, handle, indent=1)
    return index


_BYTES_PER_TOKEN_GUESS = 4  # the bar counts source bytes; it is completed exactly at the end


def _check_ids(encoded: list[np.ndarray], tokenizer, spec: str) -> None:
    largest = max((int(e.max()) for e in encoded if len(e)), default=-1)
    if largest >= tokenizer.vocab_size:
        raise UserError(f"--data {spec}: the tokenizer produced id {largest}, outside its vocabulary "
                        f"of {tokenizer.vocab_size}")


def encode_in_memory(source: DataSource, tokenizer, tokenizer_path: str | None,
                     workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `source` (every document followed by the end-of-document token) and the document
    starts, as `prepare` writes them, without writing anything."""
    dtype = token_dtype(tokenizer.vocab_size)
    pieces, starts, total = [], [0], 0
    eod = np.array([tokenizer.eod_id], dtype=dtype)
    for encoded in encoded_batches(source, tokenizer, tokenizer_path, workers):
        _check_ids(encoded, tokenizer, source.spec)
        for ids in encoded:
            pieces += [ids.astype(dtype, copy=False), eod]
            total += len(ids) + 1
            starts.append(total)
    return np.concatenate(pieces), np.asarray(starts, dtype=np.int64)


@dataclass(frozen=True)
class PreparedData:
    """A prepared folder, opened: its index, tokens (memory-mapped) and document starts."""

    folder: str
    index: dict
    tokens: "ShardedTokens"
    document_starts: np.ndarray


def is_prepared(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, INDEX))


def open_prepared(folder: str) -> PreparedData:
    path = os.path.join(folder, INDEX)
    try:
        with open(path, encoding="utf-8") as handle:
            index = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"--data {folder}: unreadable {INDEX} ({error})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION:
        raise UserError(f"--data {path}: not an h2 token index (format {FORMAT} version {VERSION})")
    dtype = np.dtype(index["dtype"])
    arrays = []
    for shard in index["shards"]:
        shard_path = os.path.join(folder, shard["file"])
        expected = shard["tokens"] * dtype.itemsize
        if not os.path.isfile(shard_path) or os.path.getsize(shard_path) != expected:
            raise UserError(f"--data {folder}: shard {shard['file']} is missing or not {expected} bytes")
        arrays.append(np.memmap(shard_path, dtype=dtype, mode="r", shape=(shard["tokens"], )))
    starts = np.load(os.path.join(folder, index["document_starts"]))
    return PreparedData(folder, index, ShardedTokens(arrays), starts)


class ShardedTokens:
    """Several token arrays read as one: `len`, slices (copied out, across shards) and `.dtype`."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.offsets = np.cumsum([0] + [len(a) for a in arrays])
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.uint16)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError("ShardedTokens takes slices")
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("ShardedTokens takes contiguous slices")
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        if len(self.arrays) == 1 or stop <= self.offsets[first + 1]:
            base = int(self.offsets[first])
            return self.arrays[first][start - base:stop - base]
        pieces, position = [], start
        while position < stop:
            shard = int(np.searchsorted(self.offsets, position, side="right")) - 1
            base, end = int(self.offsets[shard]), int(self.offsets[shard + 1])
            pieces.append(self.arrays[shard][position - base:min(stop, end) - base])
            position = min(stop, end)
        return np.concatenate(pieces)

    def to_array(self) -> np.ndarray:
        return self[0:len(self)]

    def view(self, start: int, stop: int) -> "TokenRange":
        return TokenRange(self, start, stop)


class TokenRange:
    """Tokens [start, stop) of a ShardedTokens, read lazily: `len`, contiguous slices, `.dtype`."""

    def __init__(self, base: ShardedTokens, start: int, stop: int):
        self.base, self.start, self.stop = base, start, stop
        self.dtype = base.dtype

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key):
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("TokenRange takes contiguous slices")
        return self.base[self.start + start:self.start + max(start, stop)]
