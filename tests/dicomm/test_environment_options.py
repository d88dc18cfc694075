"""DiComm settings from the environment that its engine would take but cannot work with are refused
in one line naming the variable, on the Python side, before the engine (or the torch backend) starts."""

import pytest

import dicomm

MAX_MESSAGE_BYTES = "DICOMM_MAX_MESSAGE_BYTES"


@pytest.mark.parametrize("value, expected", [
    ("0", "DICOMM_MAX_MESSAGE_BYTES (max_message_bytes) must be at least 1, got 0: every peer would refuse every "
     "message"),
    ("-1", "DICOMM_MAX_MESSAGE_BYTES=-1 is not a non-negative integer"),
    ("lots", "DICOMM_MAX_MESSAGE_BYTES=lots is not a non-negative integer"),
])
def test_a_message_size_limit_that_is_not_a_positive_count_is_refused_before_the_engine_starts(
        tmp_path, monkeypatch, value, expected):
    monkeypatch.setenv(MAX_MESSAGE_BYTES, value)
    with pytest.raises(ValueError) as refused:
        dicomm.Endpoint(dicomm.FileStore(tmp_path), 0, 1)
    assert str(refused.value) == expected


def test_a_message_size_limit_of_zero_given_as_an_option_is_refused_alike(tmp_path):
    with pytest.raises(ValueError, match=r"^DICOMM_MAX_MESSAGE_BYTES \(max_message_bytes\) must be at least 1, got 0"):
        dicomm.Endpoint(dicomm.FileStore(tmp_path), 0, 1, max_message_bytes=0)


def test_the_torch_backend_refuses_a_zero_message_size_limit_in_one_line(monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    monkeypatch.setenv(MAX_MESSAGE_BYTES, "0")
    with pytest.raises(ValueError) as refused:
        dist.init_process_group("dicomm", store=dist.HashStore(), rank=0, world_size=1)
    assert str(refused.value).splitlines() == [
        "DICOMM_MAX_MESSAGE_BYTES (max_message_bytes) must be at least 1, got 0: every peer would refuse every message"
    ]
    assert not dist.is_initialized()
