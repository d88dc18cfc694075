"""How a thread waits on a request: it polls a polled transport (shm, ibverbs) itself for at most the
wait window, then sleeps; the window is DICOMM_SPIN_US, or by default 5 ms while the host's ranks fit
its cores and 0 when they outnumber them. A tcp waiter spends the same window reading a message that is
streaming in, and sleeps while none is."""
import os
import tempfile

import pytest

import dicomm
import scenarios
from dicomm import _dicomm_core


def window_us() -> int:
    return _dicomm_core.Options.from_environment().active_wait_window_us()


def cores() -> int:
    return len(os.sched_getaffinity(0))


def test_waiters_spin_for_5_ms_while_the_hosts_ranks_fit_its_cores(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores()))
    assert window_us() == 5000


def test_waiters_sleep_at_once_when_the_hosts_ranks_outnumber_its_cores(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores() + 1))
    assert window_us() == 0


def test_dicomm_spin_us_overrides_the_window(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores() + 1))
    monkeypatch.setenv("DICOMM_SPIN_US", "250")
    assert window_us() == 250


@pytest.mark.parametrize("value", ["-3", "soon"])
def test_a_bad_spin_variable_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("DICOMM_SPIN_US", value)
    with pytest.raises(ValueError, match=f"DICOMM_SPIN_US={value} is not a"):
        dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 2, transport="tcp", connect_timeout=1)


def test_a_spin_window_past_ten_seconds_is_refused():
    with pytest.raises(ValueError, match="spin wait must be"):
        dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 2, transport="tcp", connect_timeout=1,
                        spin_wait_us=20_000_000)


def test_a_sleeping_waiter_leaves_the_cores_to_others_while_its_peer_is_late():
    # 40 replies each 5 ms late over shm: a waiter that spun would burn the whole wait in CPU.
    (waiter, _) = scenarios.run("delayed_replies", transport="shm", env={"DICOMM_SPIN_US": "0"}, pings=40,
                                delay_s=0.005)
    assert waiter["window_us"] == 0
    assert waiter["cpu_s"] < 0.1 * waiter["wall_s"], waiter


def test_a_tcp_waiter_with_a_spin_window_sleeps_while_no_message_is_streaming_in():
    # The tcp waiter reads without sleeping only while a message streams in; 40 replies each 5 ms late
    # would cost the whole wait in CPU if it spun for its 5 ms window between messages too.
    (waiter, _) = scenarios.run("delayed_replies", transport="tcp", env={"DICOMM_SPIN_US": "5000"}, pings=40,
                                delay_s=0.005)
    assert waiter["window_us"] == 5000
    assert waiter["cpu_s"] < 0.1 * waiter["wall_s"], waiter
