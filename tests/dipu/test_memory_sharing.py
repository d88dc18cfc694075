"""Device memory shared between processes through the vendor's handles (dipu_vendor_ipc.h), under
both host vendor profiles: what a handle opens, and what it refuses in one line."""
import pytest

from sharing_processes import (
    ALLOCATION_BYTES,
    EXPORTED_BYTES,
    EXPORTED_OFFSET,
    Owner,
    forge,
    handle_fields,
    open_in_another_process,
)

PATTERN = bytes(i % 251 for i in range(ALLOCATION_BYTES))


def _owner(profile):
    process = Owner(profile)
    process.profile = profile
    yield process
    process.close()


@pytest.fixture
def owner():
    yield from _owner("discrete")


@pytest.fixture(params=["discrete", "default"])
def owner_of_each_profile(request):
    yield from _owner(request.param)


def test_a_handle_opened_in_another_process_reads_and_writes_exactly_its_range(owner_of_each_profile):
    owner = owner_of_each_profile
    opened = open_in_another_process(owner.handle, owner.pid, owner.profile, fill=0xAB)
    assert opened["open_error"] is None and opened["write_error"] is None
    assert bytes.fromhex(opened["read"]) == PATTERN[EXPORTED_OFFSET:EXPORTED_OFFSET + EXPORTED_BYTES]
    expected = bytearray(PATTERN)
    expected[EXPORTED_OFFSET:EXPORTED_OFFSET + EXPORTED_BYTES] = b"\xab" * EXPORTED_BYTES
    assert owner.memory() == bytes(expected)


def test_a_copy_past_the_end_of_an_opened_range_is_refused_and_writes_nothing(owner):
    opened = open_in_another_process(owner.handle, owner.pid, owner.profile, fill=0xCD, overrun=1)
    assert "not a device memory range" in opened["write_error"]
    assert owner.memory() == PATTERN


def test_a_handle_presented_by_a_process_that_does_not_own_it_is_refused_in_one_line(owner):
    opened = open_in_another_process(owner.handle, owner.pid + 1, owner.profile)
    assert "belongs to process" in opened["open_error"] and "\n" not in opened["open_error"]


def test_a_handle_to_freed_memory_is_refused_in_one_line(owner):
    owner.free()
    opened = open_in_another_process(owner.handle, owner.pid, owner.profile)
    assert opened["open_error"] == "refused a device memory handle: the handle refers to freed device memory"


def test_a_handle_with_a_forged_nonce_is_refused(owner):
    forged = forge(owner.handle, arena_nonce=handle_fields(owner.handle)["arena_nonce"] ^ 2)
    opened = open_in_another_process(forged, owner.pid, owner.profile)
    assert "forged or stale handle" in opened["open_error"]


def test_a_handle_widened_past_its_allocation_is_refused(owner):
    fields = handle_fields(owner.handle)
    forged = forge(owner.handle, size=ALLOCATION_BYTES - EXPORTED_OFFSET + 1)
    opened = open_in_another_process(forged, owner.pid, owner.profile)
    assert "lies outside its allocation" in opened["open_error"], fields
    assert owner.memory() == PATTERN
