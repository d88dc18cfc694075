"""100,000 messages leave no requests alive and do not grow the process."""
import pytest

from scenarios import run

MESSAGES = 100_000


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_hundred_thousand_messages_leak_no_requests_or_memory(transport):
    for rank in run("stream", transport=transport, messages=MESSAGES, timeout=180):
        assert rank["live_requests"] == 0
        rss = {int(k): v for k, v in rank["rss_kib"].items()}
        # From the half-way mark the shm rings have been fully touched, so RSS must stay flat.
        growth = rss[MESSAGES] - rss[MESSAGES // 2]
        assert growth < 1024, f"RSS grew by {growth} KiB over the last {MESSAGES // 2} messages"
