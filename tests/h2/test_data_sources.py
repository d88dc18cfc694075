"""The user's data (h2.data): tokenizers, sources, `h2 data prepare`, the validation split, sharding,
and every refusal (one line, exit 2, before any work)."""

import json
import os

import numpy as np
import pytest

from h2.cli.main import main
from h2.data import load as load_module
from h2.data import load_data, load_tokenizer
from h2.data.prepare import open_prepared, token_dtype

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial kings near big rivers "
         "and small lakes under grey skies").split()


def _texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(20, 60)))) + "." for _ in range(count)]


def write_jsonl(path, texts, field="text"):
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({field: text, "id": len(text)}) + "\n")
    return str(path)


def write_parquet(path, texts, field="text"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({field: texts, "n": list(range(len(texts)))}), str(path))
    return str(path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_jsonl(folder / "a.jsonl", _texts(300, 0))
    write_parquet(folder / "b.parquet", _texts(200, 1))
    return folder


@pytest.fixture(scope="module")
def bpe(data_dir):
    """A tokenizer trained by `h2 tokenizer train` on the jsonl file."""
    out = data_dir.parent / "tokenizer"
    assert main(["tokenizer", "train", "--data",
                 str(data_dir / "a.jsonl"), "--vocab-size", "300", "--out",
                 str(out)]) == 0
    return str(out / "tokenizer.json")


def test_trained_tokenizer_round_trips_and_has_an_end_of_document_token(bpe, tmp_path):
    tokenizer = load_tokenizer(bpe)
    assert 257 <= tokenizer.vocab_size <= 300
    assert tokenizer.decode([tokenizer.eod_id]) == ""
    text = "the lazy dog jumps over seven kings."
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned
    assert [list(a)
            for a in tokenizer.encode_batch([text, "big rivers"])] == [list(ids),
                                                                       list(tokenizer.encode("big rivers"))]
    saved = tokenizer.save(str(tmp_path / "export"))
    assert load_tokenizer(saved[0]).fingerprint == tokenizer.fingerprint


def test_sentencepiece_model_is_a_tokenizer(data_dir, tmp_path):
    import sentencepiece
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(_texts(200, 3)))
    sentencepiece.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "sp"), vocab_size=60,
                                             model_type="bpe", minloglevel=2)
    tokenizer = load_tokenizer(str(tmp_path / "sp.model"))
    assert tokenizer.vocab_size == 60 and tokenizer.eod_id >= 0
    assert tokenizer.decode(tokenizer.encode("the lazy dog")) == "the lazy dog"
    loaded = load_data(str(data_dir / "a.jsonl"), tokenizer=str(tmp_path / "sp.model"), seq_len=16, vocab_size=64)
    assert int(loaded.train.sequences(0, 4).max()) < 60


def test_prepared_shards_equal_tokens_prepared_on_the_fly(data_dir, bpe, tmp_path, monkeypatch):
    prepared = tmp_path / "prepared"
    assert main([
        "data", "prepare", "--data",
        str(data_dir), "--tokenizer", bpe, "--out",
        str(prepared), "--quiet", "--workers", "2", "--shard-tokens", "5000"
    ]) == 0
    index = json.loads((prepared / "index.json").read_text())
    assert index["documents"] == 500 and len(index["shards"]) > 1
    assert index["dtype"] == "uint16"
    folder = open_prepared(str(prepared))
    tokens = folder.tokens.to_array()
    eod = load_tokenizer(bpe).eod_id
    assert (tokens[folder.document_starts[1:] - 1] == eod).all()  # every document ends with the token
    assert len(tokens) == index["tokens"] == folder.document_starts[-1]

    from_folder = load_data(str(prepared), seq_len=32, seed=3)
    in_memory = load_data(str(data_dir), tokenizer=bpe, seq_len=32, seed=3)
    monkeypatch.setattr(load_module, "IN_MEMORY_BYTES", 0)
    cached = load_data(str(data_dir), tokenizer=bpe, seq_len=32, seed=3, cache_dir=str(tmp_path / "cache"))
    assert os.listdir(tmp_path / "cache") == [index["fingerprint"]]
    for loaded in (in_memory, cached):
        assert loaded.train.corpus.fingerprint == from_folder.train.corpus.fingerprint
        assert loaded.train.num_windows == from_folder.train.num_windows
        assert np.array_equal(loaded.train.sequences(0, 64).numpy(), from_folder.train.sequences(0, 64).numpy())
        assert np.array_equal(loaded.validation.sequences(0, 2).numpy(), from_folder.validation.sequences(0, 2).numpy())
    assert from_folder.tokenizer.fingerprint == load_tokenizer(bpe).fingerprint


def test_a_pool_of_processes_tokenizes_as_one_process_does(data_dir, tmp_path):
    """The byte tokenizer (like sentencepiece) is spread over --workers processes: same tokens, in order."""
    assert main([
        "data", "prepare", "--data",
        str(data_dir), "--out",
        str(tmp_path / "bytes"), "--quiet", "--workers", "2"
    ]) == 0
    pooled = open_prepared(str(tmp_path / "bytes"))
    single = load_data(str(data_dir), seq_len=32)
    tokens = np.concatenate([single.train.corpus.tokens, single.validation.corpus.tokens])
    assert pooled.index["dtype"] == "uint16" and pooled.index["documents"] == 500
    assert np.array_equal(pooled.tokens.to_array(), tokens)
    assert int(tokens[pooled.document_starts[1] - 1]) == 0  # bytes: NUL ends a document


def test_token_dtype_follows_the_vocabulary(data_dir, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32
    vocab = {word: i for i, word in enumerate(WORDS)}
    vocab.update({f"filler{i}": len(vocab) + i for i in range(70_000)})
    vocab["<unk>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    big = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.add_special_tokens(["<|endoftext|>"])
    big.save(str(tmp_path / "big.json"))
    assert main([
        "data", "prepare", "--data",
        str(data_dir / "a.jsonl"), "--tokenizer",
        str(tmp_path / "big.json"), "--out",
        str(tmp_path / "p32"), "--quiet"
    ]) == 0
    index = json.loads((tmp_path / "p32" / "index.json").read_text())
    assert index["dtype"] == "uint32"
    assert os.path.getsize(tmp_path / "p32" / index["shards"][0]["file"]) == 4 * index["tokens"]
    tokens = open_prepared(str(tmp_path / "p32")).tokens.to_array()
    assert int(tokens.max()) == vocab["<|endoftext|>"] > 65535


def test_validation_split_is_held_out_at_a_document_boundary(data_dir, bpe):
    loaded = load_data(str(data_dir / "a.jsonl"), tokenizer=bpe, seq_len=32, validation_fraction=0.05)
    train, validation = loaded.train.corpus.tokens, loaded.validation.corpus.tokens
    total = len(train) + len(validation)
    assert len(validation) >= 0.05 * total and len(validation) >= 33
    assert train[-1] == loaded.tokenizer.eod_id  # the cut is where a document starts
    small = load_data(str(data_dir / "a.jsonl"), tokenizer=bpe, seq_len=32, validation_fraction=1e-6)
    assert small.validation.num_windows >= 1  # at least one sequence


def test_data_parallel_and_cluster_shares_are_disjoint(data_dir, bpe):
    stream = load_data(str(data_dir), tokenizer=bpe, seq_len=16, seed=5).train
    whole = stream.sequences(0, 8)
    shares = [load_data(str(data_dir), tokenizer=bpe, seq_len=16, seed=5).train.next_batch(8, r, 4) for r in range(4)]
    assert np.array_equal(np.concatenate([s.numpy() for s in shares]), whole.numpy())
    windows = [stream._window_of(g) for g in range(8)]
    assert len(set(windows)) == 8  # no window twice within a step: the shares are disjoint
    # a Di-PS cluster reads partition i of n of every combined batch (h2.train.ps_sync): disjoint too
    clusters = [load_data(str(data_dir), tokenizer=bpe, seq_len=16, seed=5).train for _ in range(2)]
    first, second = (c.next_batch(8 * 2, i, 2).numpy() for i, c in enumerate(clusters))
    assert not any((row == other).all() for row in first for other in second)


def test_a_datasets_folder_and_a_txt_glob_are_read(tmp_path, bpe):
    import datasets
    texts = _texts(50, 7)
    datasets.Dataset.from_dict({"body": texts}).save_to_disk(str(tmp_path / "saved"))
    loaded = load_data(str(tmp_path / "saved"), data_field="body", tokenizer=bpe, seq_len=16)
    tokenizer = loaded.tokenizer
    expected = sum(len(tokenizer.encode(t)) + 1 for t in texts)
    assert len(loaded.train.corpus.tokens) + len(loaded.validation.corpus.tokens) == expected
    for i in range(3):
        (tmp_path / f"doc{i}.txt").write_text(texts[i])
    (tmp_path / "skip.md").write_text("not matched")
    globbed = load_data(str(tmp_path / "doc*.txt"), seq_len=8)  # the byte tokenizer
    assert len(globbed.train.corpus.tokens) + len(globbed.validation.corpus.tokens) == sum(
        len(t.encode()) + 1 for t in texts[:3])


def _refused(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("case, message", [
    ("no_field", "no field 'text'"),
    ("parquet_no_field", "no column 'text'"),
    ("named_field", "no field 'body'"),
    ("missing", "no such file or folder"),
    ("glob", "the glob matches no file"),
    ("empty_folder", "the folder holds no file"),
    ("extension", "unsupported extension"),
    ("empty_file", "empty (0 bytes)"),
    ("empty_texts", "empty dataset"),
    ("not_utf8", "not UTF-8 text"),
    ("bad_json_line", "not a JSON line"),
    ("not_text", "field 'text' is int, not text"),
    ("no_eod", "no end-of-document token"),
    ("bad_parquet", "not a parquet file"),
    ("bad_tokenizer", "not a Hugging Face tokenizer.json"),
    ("bad_sentencepiece", "not a sentencepiece model"),
])
def test_bad_data_is_refused_in_one_line_before_any_work(case, message, tmp_path, capsys, bpe):
    data, tokenizer, extra = tmp_path / "data.jsonl", bpe, []
    data.write_text(json.dumps({"text": "some text"}) + "\n")
    if case == "no_field":
        data.write_text(json.dumps({"content": "some text"}) + "\n")
    elif case == "parquet_no_field":
        data = tmp_path / "data.parquet"
        write_parquet(data, ["x"], field="content")
    elif case == "named_field":
        extra = ["--data-field", "body"]
    elif case == "missing":
        data = tmp_path / "nothing.jsonl"
    elif case == "glob":
        data = tmp_path / "*.parquet"
    elif case == "empty_folder":
        data = tmp_path / "empty"
        data.mkdir()
    elif case == "extension":
        data = tmp_path / "data.csv"
        data.write_text("text\nhello\n")
    elif case == "empty_file":
        data.write_text("")
    elif case == "empty_texts":
        data.write_text(json.dumps({"text": ""}) + "\n")
    elif case == "not_utf8":
        data = tmp_path / "data.txt"
        data.write_bytes(b"\xff\xfe\x00bad")
    elif case == "bad_json_line":
        data.write_text("{not json\n")
    elif case == "not_text":
        data.write_text(json.dumps({"text": 7}) + "\n")
    elif case == "no_eod":
        from tokenizers import Tokenizer, models
        tokenizer = str(tmp_path / "plain.json")
        Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(tokenizer)
    elif case == "bad_parquet":
        data = tmp_path / "data.parquet"
        data.write_bytes(b"not parquet at all")
    elif case == "bad_tokenizer":
        tokenizer = str(tmp_path / "tokenizer.json")
        open(tokenizer, "w").write("{not json")
    elif case == "bad_sentencepiece":
        tokenizer = str(tmp_path / "sp.model")
        open(tokenizer, "wb").write(b"garbage")
    out = tmp_path / "run"
    _refused(capsys, [
        "data", "prepare", "--data",
        str(data), "--tokenizer", tokenizer, "--out",
        str(tmp_path / "prepared"), "--quiet", *extra
    ], message)
    assert not (tmp_path / "prepared").exists()
    _refused(capsys, [
        "train", "--data",
        str(data), "--tokenizer", tokenizer, "--out",
        str(out), "--quiet", "--model-config",
        _model_yaml(tmp_path, 512), *extra
    ], message)
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def _model_yaml(tmp_path, vocab_size: int) -> str:
    path = tmp_path / "model.yaml"
    path.write_text(f"preset: tiny\nvocab_size: {vocab_size}\n")
    return str(path)


def test_a_tokenizer_larger_than_the_model_is_refused(data_dir, bpe, tmp_path, capsys):
    out = tmp_path / "run"
    _refused(capsys,
             ["train", "--data", str(data_dir / "a.jsonl"), "--tokenizer", bpe, "--out",
              str(out)], "exceeds model 'tiny' vocab_size 256")
    assert not out.exists() or not os.listdir(out)
    _refused(capsys, ["train", "--tokenizer", bpe, "--model-config",
                      _model_yaml(tmp_path, 512), "--out",
                      str(out)], "give --data too")


@pytest.mark.parametrize("extra, message", [
    (["--validation-fraction", "0"], "--validation-fraction must be in (0, 1)"),
    (["--seq-len", "64", "--data", "SHORT"], "too few for a training and a validation sequence"),
])
def test_options_that_leave_no_training_or_validation_data_are_refused(extra, message, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("a few words")
    argv = ["train", "--out", str(tmp_path / "run"), "--quiet", *extra]
    _refused(capsys, [str(short) if a == "SHORT" else a for a in argv], message)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_bad_record_deep_in_a_file_is_one_line_when_tokenizing_reaches_it(tmp_path, bpe, capsys):
    data = tmp_path / "data.jsonl"
    write_jsonl(data, _texts(1200, 4))
    with open(data, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"body": "no text field"}) + "\n")
    _refused(capsys,
             ["data", "prepare", "--data",
              str(data), "--tokenizer", bpe, "--out",
              str(tmp_path / "p"), "--quiet"], f"{data}:1201: no field 'text'")
    assert not (tmp_path / "p").exists() and [p.name for p in tmp_path.iterdir()] == ["data.jsonl"]
