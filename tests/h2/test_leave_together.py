"""The end of a pipeline rank (h2.cli.rank.leave_together): the final barrier runs while the rank
watchdog still watches, so a peer that freezes before reaching it is named within the timeout
instead of holding the rank there forever (the fault campaign's ranks family found that hang); past
it the rank marks itself finished for the launcher (h2.launch.contract.job_finished)."""

import os
import threading
import time

import torch.distributed as dist

from h2.cli.rank import leave_together
from h2.launch.contract import job_finished
from h2.train.watchdog import RankWatchdog


class BarrierThatNeverCompletes:
    """A barrier whose peer never arrives: it returns only once the watchdog has ended the rank."""

    def __init__(self, ended: threading.Event):
        self.ended = ended

    def barrier(self) -> None:
        self.ended.wait(timeout=30)


def test_a_peer_frozen_before_the_final_barrier_is_named_within_the_timeout():
    store = dist.HashStore()
    store.set("h2/watch/0/process/1", "another-host 1 1")  # rank 1 started on another host, then froze
    store.add("h2/watch/0/beat/1", 1)
    losses, ended = [], threading.Event()

    def on_loss(line: str, code: int) -> None:
        losses.append(line)
        ended.set()

    watchdog = RankWatchdog(store, 0, 2, timeout_s=0.5, describe=lambda rank: f"rank {rank}", on_loss=on_loss)
    watchdog.start()
    started = time.monotonic()
    leave_together(BarrierThatNeverCompletes(ended), watchdog)
    assert time.monotonic() - started < 10
    assert losses and "rank 1 stopped responding" in losses[0], losses


class BarrierThatSeesTheJobFolder:

    def __init__(self, folder):
        self.folder, self.finished_when_called = folder, None

    def barrier(self) -> None:
        self.finished_when_called = job_finished(self.folder)


def test_a_rank_marks_itself_finished_once_past_the_final_barrier(tmp_path):
    store = dist.HashStore()
    watchdog = RankWatchdog(store, 1, 2, timeout_s=5, describe=lambda rank: f"rank {rank}").start()
    engine = BarrierThatSeesTheJobFolder(str(tmp_path))
    leave_together(engine, watchdog, job_folder=str(tmp_path))
    assert engine.finished_when_called is False
    assert os.listdir(tmp_path) == ["finished-1"] and job_finished(str(tmp_path))
    assert store.check(["h2/watch/0/done/1"])  # and stopped watching, telling the others
