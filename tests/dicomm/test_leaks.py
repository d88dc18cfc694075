"""100,000 messages leave no requests alive and do not grow the process."""
import pytest

from multiproc import run_ranks

MESSAGES = 100_000


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_hundred_thousand_messages_leak_no_requests_or_memory(transport):
    for rank in run_ranks("stream", transport=transport, messages=MESSAGES, timeout=180):
        assert rank["live_requests"] == 0
        rss = {int(k): v for k, v in rank["rss_kib"].items()}
        after_tenth, after_all = rss[MESSAGES // 10], rss[MESSAGES]
        assert after_all - after_tenth < 8 * 1024, f"peak RSS grew by {after_all - after_tenth} KiB"
