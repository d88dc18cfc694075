"""`h2 data prepare` (tokenize a dataset once into memory-mapped shards, h2.data.prepare) and
`h2 tokenizer train` (a byte-level BPE tokenizer trained on the user's own text, h2.data.tokenizer)."""

from __future__ import annotations

import argparse
import os
import time

from h2.core.errors import UserError


def _prepare(args: argparse.Namespace) -> int:
    from h2.data.prepare import DEFAULT_SHARD_TOKENS, INDEX, default_workers, prepare
    from h2.data.sources import resolve_source
    from h2.data.tokenizer import load_tokenizer

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.shard_tokens is not None and args.shard_tokens < 1:
        raise UserError(f"--shard-tokens must be at least 1, got {args.shard_tokens}")
    load_tokenizer(args.tokenizer)  # a tokenizer that does not parse is refused before the data is read
    source = resolve_source(args.data, args.data_field)
    if os.path.exists(os.path.join(args.out, INDEX)) and not args.overwrite:
        raise UserError(f"--out {args.out}: already holds prepared data ({INDEX}); pass --overwrite to replace it")
    started = time.perf_counter()
    index = prepare(source, args.tokenizer, args.out, workers=args.workers or default_workers(),
                    shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS, progress=not args.quiet,
                    overwrite=args.overwrite)
    seconds = time.perf_counter() - started
    print(f"prepared {index['documents']:,} documents, {index['tokens']:,} tokens ({index['dtype']}, vocabulary "
          f"{index['tokenizer']['vocab_size']:,}) in {len(index['shards'])} shard"
          f"{'s' if len(index['shards']) != 1 else ''} into {args.out} in {seconds:.2f} s "
          f"({index['tokens'] / seconds:,.0f} tokens/s); fingerprint {index['fingerprint']}")
    return 0


def _train_tokenizer(args: argparse.Namespace) -> int:
    from h2.data.sources import resolve_source
    from h2.data.tokenizer import HF_FILE, load_tokenizer, train_bpe

    target = os.path.join(args.out, HF_FILE)
    if os.path.exists(target) and not args.overwrite:
        raise UserError(f"--out {args.out}: already holds {HF_FILE}; pass --overwrite to replace it")
    if args.vocab_size < 1:
        raise UserError(f"--vocab-size must be positive, got {args.vocab_size}")
    source = resolve_source(args.data, args.data_field)
    started = time.perf_counter()
    path = train_bpe(source.documents(), args.vocab_size, args.out)
    tokenizer = load_tokenizer(path)
    print(f"trained a byte-level BPE tokenizer of {tokenizer.vocab_size:,} tokens (end of document: id "
          f"{tokenizer.eod_id}) on {args.data} in {time.perf_counter() - started:.2f} s: {path}")
    return 0


def add_commands(sub) -> None:
    data = sub.add_parser("data", help="prepare a dataset: tokenize it once into memory-mapped token shards")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=type(data))
    prepare = data_sub.add_parser(
        "prepare", help="tokenize --data with --tokenizer into --out: shards, index.json, documents.npy, "
        "the tokenizer's files (docs/data.md)")
    prepare.add_argument(
        "--data", required=True, metavar="PATH",
        help="a file, a folder or a glob of .txt, .jsonl/.json or .parquet files, or a folder "
        "saved by datasets' save_to_disk")
    prepare.add_argument("--tokenizer", metavar="PATH",
                         help="a Hugging Face tokenizer.json or a sentencepiece .model (default: bytes)")
    prepare.add_argument("--out", required=True, metavar="DIR", help="the prepared folder")
    prepare.add_argument("--data-field", default="text", help="the records' field that holds the text (default text)")
    prepare.add_argument("--workers", type=int, help="tokenizing processes (default: the CPUs this process may use)")
    prepare.add_argument("--shard-tokens", type=int, help="tokens per shard file (default 2**26)")
    prepare.add_argument("--overwrite", action="store_true", help="replace a prepared folder at --out")
    prepare.add_argument("--quiet", action="store_true", help="no progress bar")
    prepare.set_defaults(handler=_prepare)

    tokenizer = sub.add_parser("tokenizer", help="train a tokenizer on your own text")
    tokenizer_sub = tokenizer.add_subparsers(dest="tokenizer_command", required=True, parser_class=type(tokenizer))
    train = tokenizer_sub.add_parser(
        "train", help="train a byte-level BPE tokenizer (the tokenizers library, locally) with an "
        "end-of-document token <|endoftext|>; writes OUT/tokenizer.json")
    train.add_argument("--data", required=True, metavar="PATH", help="the text, as for h2 data prepare")
    train.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary (at least 257)")
    train.add_argument("--out", required=True, metavar="DIR", help="folder for tokenizer.json")
    train.add_argument("--data-field", default="text", help="the records' field that holds the text (default text)")
    train.add_argument("--overwrite", action="store_true", help="replace OUT/tokenizer.json")
    train.set_defaults(handler=_train_tokenizer)
