"""Device-direct transfers: dipu tensors (discrete profile) between two processes through the
vendor's registered memory, with no host staging copy; and what the path refuses."""
from device_scenarios import DEVICE_SIZES, run


def test_dipu_tensors_move_device_direct_with_no_staging_copy():
    sender, receiver = run("transfer", direct=True)
    assert sender["device_direct"] and receiver["device_direct"]
    assert receiver["intact"] == [True] * len(DEVICE_SIZES)
    staging = [r["copies"]["host_to_device"] + r["copies"]["device_to_host"] for r in (sender, receiver)]
    assert staging == [0, 0]
    assert receiver["copies"]["device_to_device"] == len(DEVICE_SIZES)


def test_without_device_direct_dipu_tensors_are_staged_through_host_memory():
    sender, receiver = run("transfer", direct=False)
    assert not sender["device_direct"]
    assert receiver["intact"] == [True] * len(DEVICE_SIZES)
    assert (sender["copies"]["device_to_host"], receiver["copies"]["host_to_device"]) == (len(DEVICE_SIZES), ) * 2


def test_a_device_message_larger_than_its_receive_is_refused_and_nothing_around_the_receive_changes():
    sender, receiver = run("overrun")
    assert "does not fit" in receiver["recv_error"] and "\n" not in receiver["recv_error"]
    assert "refused" in sender["send_error"]
    assert receiver["untouched"]


def test_a_host_message_into_a_device_receive_is_refused_in_one_line():
    _, receiver = run("host_into_device")
    assert "is in host memory; this receive is in device memory" in receiver["recv_error"]


def test_a_device_message_lands_in_a_host_receive():
    _, receiver = run("device_into_host")
    assert receiver["intact"]
