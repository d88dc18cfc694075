"""The frame decoder and the stream receive path never crash on arbitrary bytes; the decoder's
microbenchmark (pytest-benchmark: run once here; timed with --benchmark-enable)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dicomm import _dicomm_core as core

HEADER = core.FRAME_HEADER_BYTES
KINDS = ["Hello", "HelloReply", "Data", "ReadyToSend", "ClearToSend", "Done", "Credit", "Pulled"]


@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=0, max_size=2 * HEADER))
def test_arbitrary_bytes_decode_to_a_header_or_a_frame_error(data):
    try:
        header = core.decode_frame_header(data)
    except core.FrameError as e:
        assert str(e).startswith("malformed frame")
    else:
        assert len(data) >= HEADER and header["kind"] in KINDS


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), tag=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**64 - 1), total=st.integers(
    0, 1 << 30), offset=st.integers(0, 1 << 30), payload=st.integers(0, 4096), address=st.integers(0, 2**64 - 1))
def test_valid_headers_round_trip_and_invalid_ones_are_refused(kind, tag, seq, total, offset, payload, address):
    encoded = core.encode_frame_header(kind, tag=tag, seq=seq, total_bytes=total, offset=offset, payload_bytes=payload,
                                       remote_address=address)
    try:
        header = core.decode_frame_header(encoded)
    except core.FrameError:
        carries = kind in ("Hello", "HelloReply", "Data")
        assert (not carries and payload) or (kind == "Data" and offset + payload > total)
    else:
        assert (header["tag"], header["seq"], header["total_bytes"], header["offset"], header["payload_bytes"],
                header["remote_address"]) == (tag, seq, total, offset, payload, address)


def test_benchmark_decode_frame_header(benchmark):
    header = benchmark(core.decode_frame_header,
                       core.encode_frame_header("Data", tag=3, seq=9, total_bytes=4096, payload_bytes=4096))
    assert header["total_bytes"] == 4096


def data_frame(seq, tag, payload, total=None, offset=0):
    total = len(payload) if total is None else total
    return core.encode_frame_header("Data", tag=tag, seq=seq, total_bytes=total, offset=offset,
                                    payload_bytes=len(payload)) + payload


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=300)), max_size=12), cuts=st.lists(
    st.integers(1, 97), max_size=40), post_first=st.booleans())
def test_a_valid_stream_delivers_every_message_however_it_is_split(messages, cuts, post_first):
    decoder = core.StreamDecoder()
    stream = b"".join(data_frame(seq, tag, payload) for seq, (tag, payload) in enumerate(messages))
    handles = []
    if post_first:
        handles = [decoder.post_recv(tag, len(payload)) for tag, payload in messages]
    position, cut_index = 0, 0
    while position < len(stream):
        step = cuts[cut_index % len(cuts)] if cuts else len(stream)
        decoder.feed(stream[position:position + step])
        position += step
        cut_index += 1
    if not post_first:
        handles = [decoder.post_recv(tag, len(payload)) for tag, payload in messages]
    # Per tag, receives match messages in order.
    for handle, (tag, payload) in zip(handles, messages):
        result = decoder.result(handle)
        assert result["ok"] and result["data"] == payload


@settings(max_examples=400, deadline=None)
@given(prefix=st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=64)), max_size=3), garbage=st.binary(
    min_size=1, max_size=400), capacity=st.integers(0, 200))
def test_garbage_after_valid_frames_raises_frame_error_or_is_consumed_never_crashes(prefix, garbage, capacity):
    decoder = core.StreamDecoder(max_message_bytes=1 << 20)
    for tag in range(4):
        decoder.post_recv(tag, capacity)
    stream = b"".join(data_frame(seq, tag, payload) for seq, (tag, payload) in enumerate(prefix))
    try:
        decoder.feed(stream + garbage)
    except core.FrameError as e:
        assert "malformed frame" in str(e)
        try:
            decoder.feed(b"more")
        except core.FrameError:
            pass
        else:
            raise AssertionError("a broken decoder must keep refusing")


def test_a_frame_with_a_skipped_sequence_number_is_refused():
    with pytest.raises(core.FrameError, match="sequence 1"):
        core.StreamDecoder().feed(data_frame(1, 0, b"abc"))  # sequence 1 before 0


def test_a_slice_that_does_not_continue_its_message_is_refused():
    decoder = core.StreamDecoder()
    decoder.feed(data_frame(0, 0, b"ab", total=10))
    with pytest.raises(core.FrameError, match="does not continue"):
        decoder.feed(data_frame(0, 0, b"cd", total=10, offset=5))  # a gap in the message


def test_a_receive_posted_while_its_message_arrives_gets_every_byte():
    decoder = core.StreamDecoder()
    first, second, third = b"a" * 10, b"b" * 10, b"c" * 5
    decoder.feed(data_frame(0, 2, first, total=25))
    handle = decoder.post_recv(2, 25)
    decoder.feed(data_frame(0, 2, second, total=25, offset=10))
    decoder.feed(data_frame(0, 2, third, total=25, offset=20))
    result = decoder.result(handle)
    assert result["ok"] and result["data"] == first + second + third
    assert decoder.stored == 0


def test_the_stream_reader_names_the_size_of_a_streaming_message_from_its_first_payload_byte_to_its_last():
    # One 8-byte message in two 4-byte Data frames: the tcp waiter reads a small message streaming in
    # without sleeping exactly while this is its size.
    decoder = core.StreamDecoder()
    decoder.post_recv(tag=0, capacity=8)
    stream = data_frame(0, 0, b"abcd", total=8) + data_frame(0, 0, b"efgh", total=8, offset=4)
    seen = []
    for position in range(len(stream)):
        seen.append(decoder.streaming_message_bytes)
        decoder.feed(stream[position:position + 1])
    seen.append(decoder.streaming_message_bytes)
    assert seen == [0] * HEADER + [8] * (len(stream) - HEADER) + [0]
