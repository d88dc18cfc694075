import pytest
import torch

from h2.core.errors import UserError
from h2.data import ByteTokenizer, SequenceStream, load_stdlib_corpus


def test_byte_tokenizer_round_trips_unicode():
    text = "def f(x):  # naïve → ok\n"
    tokenizer = ByteTokenizer()
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode(text).max() < ByteTokenizer.vocab_size


def test_corpus_is_python_source_and_deterministic(corpus):
    again = load_stdlib_corpus(max_bytes=1 << 20)
    assert corpus.fingerprint == again.fingerprint
    assert len(corpus) == 1 << 20
    assert b"def " in corpus.tokens.tobytes()


def test_targets_are_inputs_shifted_by_one(corpus):
    batch = SequenceStream(corpus, seq_len=32).next_batch(4)
    assert batch.shape == (4, 33) and batch.dtype == torch.int64
    text = corpus.tokens.tobytes()
    for row in batch:
        assert bytes(row.tolist()) in text


def test_data_parallel_shards_partition_the_global_batch(corpus):
    whole = SequenceStream(corpus, 32, seed=1).next_batch(8)
    shards = [SequenceStream(corpus, 32, seed=1).next_batch(8, dp_rank=r, dp_size=4) for r in range(4)]
    assert torch.equal(torch.cat(shards), whole)


def test_resuming_from_a_position_continues_the_same_stream(corpus):
    stream = SequenceStream(corpus, 32, seed=2)
    stream.next_batch(5)
    state = stream.state_dict()
    expected = stream.next_batch(5)
    resumed = SequenceStream(corpus, 32, seed=2)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch(5), expected)


def test_a_new_epoch_reshuffles_and_covers_every_window(corpus):
    stream = SequenceStream(corpus, 4096, seed=0)
    first_epoch = [stream._window_of(g) for g in range(stream.num_windows)]
    second_epoch = [stream._window_of(g) for g in range(stream.num_windows, 2 * stream.num_windows)]
    assert sorted(first_epoch) == list(range(stream.num_windows)) == sorted(second_epoch)
    assert first_epoch != second_epoch


def test_state_from_another_seed_is_refused(corpus):
    state = SequenceStream(corpus, 32, seed=1).state_dict()
    with pytest.raises(UserError, match="'seed'"):
        SequenceStream(corpus, 32, seed=2).load_state_dict(state)


def test_uneven_global_batch_is_refused(corpus):
    with pytest.raises(UserError, match="not divisible"):
        SequenceStream(corpus, 32).next_batch(6, dp_rank=0, dp_size=4)
