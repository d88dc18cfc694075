"""JEEVES with data-parallel replicas sharing the cross-site link (HotNets '25, section 3.3) on the
runtime: the generator gives every replica its own orders and the link its global send lists, the
ranks pace their cross-site sends on one queue per boundary and direction in that order, and the
2-replica run across the emulated sites trains like the single-device trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.links import Link
from h2.core.strategy import load_strategy
from heteroauto.jeeves_plan import predicted_iteration_s, strategy_costs, with_schedule_orders
from heteropp.p2p import SharedLink, _SharedQueue
from heteropp_launch import max_relative_loss_difference, run_reference

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO_ROOT, "configs/clusters/local-2site-dp2.yaml")
STRATEGY = os.path.join(REPO_ROOT, "configs/strategies/local-2site-dp2.yaml")


def generated():
    return with_schedule_orders(load_strategy(STRATEGY), load_cluster(CLUSTER), "jeeves", STRATEGY)[0]


def test_the_generator_gives_each_replica_its_orders_and_the_link_one_send_list_per_direction():
    strategy = generated()
    assert len(strategy.replica_orders) == 2 and strategy.replica_orders[0] == strategy.orders
    # k = 3 binds on stage 0: neither GPipe (all forwards first) nor 1F1B (two forwards ahead)
    assert strategy.orders[0] == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    assert sorted(strategy.send_lists) == [
        "0B: 0.0 1.0 0.1 1.1 0.2 1.2 0.3 1.3 0.4 1.4 0.5 1.5 0.6 1.6 0.7 1.7",
        "0F: 0.0 1.0 0.1 1.1 0.2 1.2 0.3 1.3 0.4 1.4 0.5 1.5 0.6 1.6 0.7 1.7"
    ]
    strategy.validate(STRATEGY)


def test_the_prediction_replays_both_replicas_on_one_queue():
    strategy, cluster = generated(), load_cluster(CLUSTER)
    costs = strategy_costs(strategy, cluster, STRATEGY)
    alone = predicted_iteration_s(
        strategy.__class__(**{**strategy.__dict__, "replica_orders": None, "send_lists": None, "dp": 1}), costs,
        "jeeves", STRATEGY)
    shared = predicted_iteration_s(strategy, costs, "jeeves", STRATEGY)
    assert shared > alone  # the second replica's messages wait their turns on the link


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.send_lists.__setitem__(0, "0F: 0.0 0.0"), "must list every replica's (0..1) every micro-batch"),
    (lambda s: s.send_lists.__setitem__(0, "7F: 0.0"), "'7F' is not a new boundary 0..0 with F or B"),
    (lambda s: s.send_lists.__setitem__(0, "0F 0.0"), "expected 'BOUNDARY F|B: replica.micro_batch ...'"),
    (lambda s: s.replica_orders.pop(), "field 'replica_orders' must list one per-stage order list per replica (2)"),
])
def test_bad_replica_orders_and_send_lists_are_one_line(edit, message):
    strategy = generated()
    edit(strategy)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        strategy.validate("s.yaml")


class _Store:
    """The job store's get (blocking), set and delete_key, in one process."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def set(self, key, value):
        with self.changed:
            self.values[key] = value.encode()
            self.changed.notify_all()

    def get(self, key):
        with self.changed:
            self.changed.wait_for(lambda: key in self.values, timeout=10)
            return self.values[key]

    def delete_key(self, key):
        with self.changed:
            self.values.pop(key, None)


class _Pacer:

    def __init__(self):
        self.released = []

    def release_at(self, send, due):
        self.released.append((send, due))


def test_two_replicas_take_one_link_in_the_send_list_order():
    link = Link(bandwidth_gbps=1e-6, latency_us=500_000)  # 1000 bytes/s, 0.5 s
    order = [(0, 0), (1, 0), (0, 1), (1, 1)]
    store, pacers = _Store(), [_Pacer(), _Pacer()]
    queues = [_SharedQueue(SharedLink(link, order, replica, store, "t"), pacers[replica]) for replica in (0, 1)]
    start = time.time()
    sends = {}
    for replica, micro_batch in ((1, 1), (1, 0), (0, 1), (0, 0)):  # posted out of the list's order
        sends[(replica, micro_batch)] = queues[replica].post(lambda: None, micro_batch, 100)
    deadline = time.time() + 10
    while sum(len(p.released) for p in pacers) < 4 and time.time() < deadline:
        time.sleep(0.01)
    due = {
        next(m for m, s in sends.items() if s is send): when - time.monotonic() + time.time() - start
        for pacer in pacers for send, when in pacer.released
    }
    # each message 0.1 s on the wire after the one before it in the list: the link is one queue
    assert [round(due[m], 1) for m in order] == [0.6, 0.7, 0.8, 0.9]


def h2_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "h2", "train", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_two_replicas_sharing_the_cross_site_link_train_like_the_single_device_trainer(tmp_path):
    out = tmp_path / "run"
    result = h2_train("--strategy", STRATEGY, "--cluster", CLUSTER, "--schedule", "jeeves", "--steps", "3", "--threads",
                      "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "global send lists: 0B: 0.0 1.0 0.1 1.1" in result.stdout
    with open(out / "metrics.jsonl") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    reference = run_reference(load_strategy(STRATEGY).to_dict(), 3)
    assert max_relative_loss_difference(records, reference) < 1e-5
