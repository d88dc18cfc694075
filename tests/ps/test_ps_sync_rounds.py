"""Mode sync through the real master and shards (in-process): its first round waits for every cluster of
the run file to have joined, and a round sums its pushes in the run file's order."""

import json
import threading
import time

from h2.ps.client import ClusterClient
from ps_harness import running_ps
from test_ps_rounds import model_tensors


def rounds_of(out_dir) -> list[dict]:
    events = [json.loads(line) for line in open(out_dir / "rounds.jsonl")]
    return [event for event in events if event["event"] == "round"]


def sync_in_thread(client: ClusterClient, results: dict) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: results.__setitem__(client.cluster_id, client.sync(model_tensors(), tokens=512, loss=3.0)))
    thread.start()
    return thread


def test_sync_runs_no_round_before_every_cluster_of_the_run_file_has_joined(tmp_path):
    results = {}
    with running_ps(tmp_path, clusters=("a", "b"), mode="sync") as (_, _, address):
        early = ClusterClient(address, "a", log=lambda _: None)
        first = sync_in_thread(early, results)
        time.sleep(1.5)  # a alone is the only active cluster: before the fix, its push made a round of its own
        assert rounds_of(tmp_path) == [] and first.is_alive()
        late = ClusterClient(address, "b", log=lambda _: None)
        second = sync_in_thread(late, results)
        first.join(30)
        second.join(30)
        early.close()
        late.close()
    rounds = rounds_of(tmp_path)
    assert [r["participants"] for r in rounds] == [["a", "b"]]
    assert (results["a"].status, results["b"].status, results["a"].version) == ("applied", "applied", 1)


def test_a_sync_round_sums_its_pushes_in_the_run_files_order_whatever_their_arrival(tmp_path):
    results = {}
    with running_ps(tmp_path, clusters=("a", "b"), mode="sync") as (_, _, address):
        clients = {cid: ClusterClient(address, cid, log=lambda _: None) for cid in ("a", "b")}
        late_first = sync_in_thread(clients["b"], results)
        time.sleep(1.0)
        threads = [late_first, sync_in_thread(clients["a"], results)]
        for thread in threads:
            thread.join(30)
        for client in clients.values():
            client.close()
    assert [r["participants"] for r in rounds_of(tmp_path)] == [["a", "b"]]
