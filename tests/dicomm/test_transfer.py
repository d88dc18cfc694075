"""Two processes exchange messages over each transport that runs here."""
import os

import pytest

from h2.core.ranks import RankFailure
from scenarios import run

TRANSPORTS = ["tcp", "shm"]
# shm copies large messages half by each side; "shm-sender-copies" turns that split off, and
# "shm-ring-only" turns cross-memory attach off (as where ptrace is forbidden): large messages
# then stream through the ring.
VARIANTS = {
    "tcp": ("tcp", {}), "shm": ("shm", {}), "shm-sender-copies": ("shm", {"DICOMM_SHM_SPLIT_BYTES": "0"}),
    "shm-ring-only": ("shm", {"DICOMM_SHM_CMA": "0"})
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def exchange(request):
    transport, env = VARIANTS[request.param]
    sender, receiver = run("correctness", transport=transport, env=env)
    return transport, sender, receiver


def test_each_peer_uses_the_requested_transport(exchange):
    transport, sender, receiver = exchange
    assert sender["transport"] == receiver["transport"] == transport


def test_sizes_from_zero_to_64_mib_arrive_intact_when_the_receive_comes_first(exchange):
    _, _, receiver = exchange
    assert receiver["sizes_recv_first"] == [True] * 6


def test_sizes_from_zero_to_64_mib_arrive_intact_when_the_send_comes_first(exchange):
    _, _, receiver = exchange
    assert receiver["sizes_send_first"] == [True] * 6


def test_unaligned_buffers_arrive_intact(exchange):
    assert exchange[2]["unaligned"] is True


def test_a_thousand_outstanding_messages_each_way_complete_without_deadlock(exchange):
    _, sender, receiver = exchange
    assert sender["outstanding_count"] >= 1000
    assert sender["outstanding_both_ways"] and receiver["outstanding_both_ways"]


def test_messages_of_one_tag_arrive_in_order_while_tags_interleave(exchange):
    assert exchange[2]["ordered_per_tag"] is True


def test_a_message_too_large_for_its_receive_fails_that_receive_with_a_clear_error(exchange):
    errors = exchange[2]["truncation_errors"]
    assert len(errors) == 2
    for error in errors:
        assert "does not fit" in error and "receive buffer" in error


def test_the_connection_keeps_working_after_a_refused_message(exchange):
    assert exchange[2]["usable_after_truncation"] is True


def test_any_torch_distributed_store_drives_rendezvous():
    dist = pytest.importorskip("torch.distributed")
    import datetime

    from scenarios import start, torch_store_exchange

    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    with start("torch_store", ranks=[1], transport="shm", port=store.port) as peer:  # rank 0 is this process
        assert torch_store_exchange(store, 0, "shm")
        assert peer.results()[0]["ok"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_device_buffers_are_staged_through_host_memory_by_the_copy_hooks(transport):
    sender, receiver = run("device_staging", transport=transport)
    size = (1 << 20) + 3
    assert sender["copies"]["to_host"] == size
    assert receiver["copies"]["from_host"] == size
    assert receiver["intact"] is True


def _kernel_buffer_limit() -> int:
    with open("/proc/sys/net/core/wmem_max") as wmem, open("/proc/sys/net/core/rmem_max") as rmem:
        return max(int(wmem.read()), int(rmem.read()))


@pytest.mark.skipif(os.geteuid() != 0, reason="passing net.core.wmem_max needs CAP_NET_ADMIN (root)")
def test_tcp_socket_buffers_grow_past_the_kernel_limit_as_root():
    requested = 4 * _kernel_buffer_limit()
    ranks = run("socket_buffers", transport="tcp", env={"DICOMM_TCP_SOCKET_BUFFER_BYTES": str(requested)})
    # The kernel doubles what it is given (bookkeeping overhead), as socket(7) says.
    assert [rank["buffers"] for rank in ranks] == [[(2 * requested, 2 * requested)]] * 2


def congestion_controls(env=None):
    return [[socket["congestion"] for socket in rank["sockets"]]
            for rank in run("tcp_socket_options", transport="tcp", env=env)]


def test_tcp_connections_to_a_peer_on_this_host_use_reno_by_default():
    # BBR sizes its window from the bandwidth-delay product, a few segments on loopback: a 1 MiB
    # message then waits for acknowledgements (docs/dicomm.md, tcp).
    assert congestion_controls() == [["reno"]] * 2


def test_tcp_connections_to_a_peer_on_this_host_use_what_is_asked_for():
    assert congestion_controls({"DICOMM_TCP_CONGESTION": "reno"}) == [["reno"]] * 2


def test_tcp_congestion_default_leaves_the_kernels_choice():
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as default:
        kernel_default = default.read().strip()
    assert congestion_controls({"DICOMM_TCP_CONGESTION": "default"}) == [[kernel_default]] * 2


def test_a_congestion_control_the_kernel_lacks_fails_setup_naming_it_and_what_exists():
    with pytest.raises(RankFailure, match="tcp congestion control 'nosuchcc' .* refused by the kernel: .*available: "):
        congestion_controls({"DICOMM_TCP_CONGESTION": "nosuchcc"})


@pytest.mark.parametrize("setting, expected", [(None, 1 << 20), ("65536", 65536)])
def test_tcp_connections_keep_at_most_the_not_sent_low_water_mark_queued_in_the_kernel(setting, expected):
    env = {"DICOMM_TCP_NOTSENT_LOWAT_BYTES": setting} if setting else None
    ranks = run("tcp_socket_options", transport="tcp", env=env)
    assert [[socket["notsent_lowat"] for socket in rank["sockets"]] for rank in ranks] == [[expected]] * 2
