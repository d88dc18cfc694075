"""Data-flow frames are checked before their payload is touched."""

import pytest

from h2.ps import wire


def frames(kind=wire.PUSH, nbytes=8, payload=b"x" * 8):
    return [wire.Header(kind, 1, 7, 0, nbytes).pack(), payload]


def test_a_well_formed_frame_parses():
    header, payload = wire.parse(frames(), max_payload=64)
    assert (header.kind, header.layer, header.ticket, bytes(payload)) == (wire.PUSH, 1, 7, b"x" * 8)


@pytest.mark.parametrize("message, expected", [
    (frames(nbytes=8, payload=b"x" * 5), "truncated or padded frame: header declares 8 payload bytes, 5 arrived"),
    (frames(nbytes=1 << 40, payload=b""), f"frame declares {1 << 40} payload bytes, more than the 64 allowed"),
    ([b"JUNK" + frames()[0][4:], b"x" * 8], "bad magic"),
    ([frames()[0][:10], b""], "header is 10 bytes, expected 32"),
    (frames()[:1], "expected 2 message parts"),
    (frames(kind=9), "unknown frame kind 9"),
])
def test_a_bad_frame_is_one_line_naming_what_is_wrong(message, expected):
    with pytest.raises(wire.FrameError, match=expected.replace("(", r"\(")):
        wire.parse(message, max_payload=64)
