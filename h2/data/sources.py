"""The user's text (`--data PATH`): a file, a folder or a glob of `.txt`, `.jsonl`/`.json` (one field,
`text` unless `--data-field` names another) or `.parquet` files, or a folder written by the `datasets`
library's `save_to_disk`. Documents come in a fixed order (files sorted by path, records in file order);
a `.txt` file is one document. Every refusal is one line naming the path, raised before any work.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterator

from h2.core.errors import UserError

TEXT_EXTENSIONS = (".txt", )
JSON_EXTENSIONS = (".jsonl", ".json")
PARQUET_EXTENSIONS = (".parquet", )
SUPPORTED = TEXT_EXTENSIONS + JSON_EXTENSIONS + PARQUET_EXTENSIONS
DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
DATASETS = "datasets"


@dataclass(frozen=True)
class DataSource:
    """What `--data` named, resolved: the files (or one `datasets` folder) and the field to read."""

    spec: str
    paths: tuple[str, ...]
    kind: str  # "files" or "datasets"
    field: str

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.content_files())

    def content_files(self) -> list[str]:
        if self.kind != DATASETS:
            return list(self.paths)
        found = []
        for directory, subdirs, files in os.walk(self.paths[0]):
            subdirs.sort()
            found.extend(os.path.join(directory, name) for name in sorted(files))
        return found

    def fingerprint(self) -> str:
        """A digest of the field name and every content byte, in order: the same text, the same print."""
        digest = hashlib.sha256(f"h2-source-1\0{self.field}\0{self.kind}\0".encode())
        for path in self.content_files():
            digest.update(os.path.basename(path).encode() + b"\0")
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()[:16]

    def documents(self) -> Iterator[str]:
        """Every document's text, in the fixed order."""
        if self.kind == DATASETS:
            yield from _dataset_documents(self.paths[0], self.field)
            return
        for path in self.paths:
            yield from _file_documents(path, self.field)


def _is_datasets_folder(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in DATASETS_MARKERS)


def _check_readable(path: str, spec: str) -> None:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as handle:
                handle.read(1)
    except OSError as error:
        raise UserError(f"--data {spec}: {path} is not readable ({error.strerror})") from None


def resolve_source(spec: str, field: str = "text") -> DataSource:
    """The files `spec` names (a file, a folder searched recursively, or a glob), each checked."""
    if not spec:
        raise UserError("--data: empty path")
    if _is_datasets_folder(spec):
        _check_readable(spec, spec)
        return _checked(DataSource(spec, (spec, ), DATASETS, field))
    if any(ch in spec for ch in "*?["):
        paths = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
        if not paths:
            raise UserError(f"--data {spec}: the glob matches no file")
    elif os.path.isdir(spec):
        paths = []
        for directory, subdirs, files in os.walk(spec):
            subdirs.sort()
            paths.extend(os.path.join(directory, n) for n in sorted(files) if not n.startswith("."))
        paths = sorted(paths)
        if not paths:
            raise UserError(f"--data {spec}: the folder holds no file")
    elif os.path.exists(spec):
        paths = [spec]
    else:
        raise UserError(f"--data {spec}: no such file or folder")
    for path in paths:
        if not path.lower().endswith(SUPPORTED):
            raise UserError(f"--data {spec}: {path} has an unsupported extension (supported: {', '.join(SUPPORTED)}, "
                            f"or a folder saved by datasets' save_to_disk)")
        _check_readable(path, spec)
    return _checked(DataSource(spec, tuple(paths), "files", field))


def _checked(source: DataSource) -> DataSource:
    """Refuse a source without the field or without any text, reading only what that takes."""
    if source.kind == DATASETS:
        _check_dataset_field(source.paths[0], source.field)
    else:
        for path in source.paths:
            if path.lower().endswith(PARQUET_EXTENSIONS):
                _check_parquet_field(path, source.field)
    if source.total_bytes == 0:
        raise UserError(f"--data {source.spec}: empty (0 bytes)")
    for text in source.documents():
        if text:
            return source
    raise UserError(f"--data {source.spec}: empty dataset (no document holds any text)")


# ---- per format ----------------------------------------------------------------------------------


def _file_documents(path: str, field: str) -> Iterator[str]:
    lower = path.lower()
    if lower.endswith(TEXT_EXTENSIONS):
        yield _read_text(path)
    elif lower.endswith(PARQUET_EXTENSIONS):
        yield from _parquet_documents(path, field)
    else:
        yield from _json_documents(path, field)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as error:
        raise UserError(f"--data {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def _record_text(record, field: str, where: str) -> str:
    if not isinstance(record, dict):
        raise UserError(f"--data {where}: expected a JSON object with field '{field}', got {type(record).__name__}")
    if field not in record:
        known = ", ".join(list(record)[:8])
        raise UserError(f"--data {where}: no field '{field}' (fields: {known}); name another with --data-field")
    value = record[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"--data {where}: field '{field}' is {type(value).__name__}, not text")
    return value


def _json_documents(path: str, field: str) -> Iterator[str]:
    text = _read_text(path)
    stripped = text.lstrip()
    if path.lower().endswith(".json") and stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise UserError(f"--data {path}: not JSON ({error.msg}, line {error.lineno})") from None
        for number, record in enumerate(records):
            yield _record_text(record, field, f"{path}: record {number}")
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"--data {path}:{number}: not a JSON line ({error.msg})") from None
        yield _record_text(record, field, f"{path}:{number}")


def _parquet_file(path: str):
    import pyarrow.parquet as pq
    try:
        return pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError
        raise UserError(f"--data {path}: not a parquet file ({str(error).splitlines()[0]})") from None


def _check_parquet_field(path: str, field: str) -> None:
    names = _parquet_file(path).schema_arrow.names
    if field not in names:
        raise UserError(f"--data {path}: no column '{field}' (columns: {', '.join(names[:8])}); "
                        f"name another with --data-field")


def _parquet_documents(path: str, field: str) -> Iterator[str]:
    parquet = _parquet_file(path)
    for batch in parquet.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is not None and not isinstance(value, str):
                raise UserError(f"--data {path}: column '{field}' holds {type(value).__name__}, not text")
            yield value or ""


def _load_dataset(path: str):
    import datasets
    try:
        loaded = datasets.load_from_disk(path)
    except Exception as error:  # datasets raises FileNotFoundError, ValueError, ...
        raise UserError(f"--data {path}: not a folder saved by datasets' save_to_disk "
                        f"({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise UserError(f"--data {path}: a DatasetDict without a 'train' split (splits: {', '.join(loaded)})")
        loaded = loaded["train"]
    return loaded


def _check_dataset_field(path: str, field: str) -> None:
    names = _load_dataset(path).column_names
    if field not in names:
        raise UserError(f"--data {path}: no column '{field}' (columns: {', '.join(names[:8])}); "
                        f"name another with --data-field")


def _dataset_documents(path: str, field: str) -> Iterator[str]:
    dataset = _load_dataset(path)
    for start in range(0, len(dataset), 4096):
        for value in dataset[start:start + 4096][field]:
            yield value or ""
