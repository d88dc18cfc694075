"""The master: the control flow of a Di-PS run (Algorithm 1). It holds no model bytes: cluster ids,
sessions and consumed tokens, push tickets, shard addresses and versions, heartbeats, the penalty's
statistics, and the log of rounds and events.

A cluster's sync point, as the master sees it:
  RequestPush -> a ticket, announced to every shard (the cluster then pushes its layers to them)
  CommitPush  -> two-stage commit: every shard confirms it holds the ticket's layers; the push joins
                 the pending round and, in modes async and dips, re-arms the window (grace_s; 0 in async)
  AwaitRound  -> once the window closes (sync: once every cluster of the run file has joined and every
                 active one committed) the round runs:
                 Measure on every shard -> the penalty's verdict -> Prepare -> the committed version
                 is recorded -> Commit; the answer names the version to pull (or why it was skipped)
In mode async-diloco (h2.core.dips.MODE_RULES) the master coordinates only membership and rounds: the clusters
push pseudo-gradients against their own copies of the global model, the shards average them, and every
participant applies its own outer step (h2.ps.client.ClusterOuter).
A shard that fails or is missing during a round makes the round skipped: its pushes are forgotten,
the participants pull the version they had and go on training. A cluster that misses `missed_beats`
heartbeats is dropped (its pending push with it) and may join again; a shard that misses them is
marked lost until it registers again (the launcher restarts it from its snapshot). The master's own
state (version, round, penalty statistics, tokens) is written to `master/state.json` after every
round, so a restarted master goes on where it stopped; shards and clusters re-register by themselves.

Who may call what (h2.ps.auth): the master holds the run secret and admits only calls signed by a
participant of the run file (`cluster/<id>`, `shard/<i>`); a cluster's calls name only itself (and,
after Join, its current session), a shard's register and beat only itself; `Status` answers
participants only. A committed push counts at most the tokens H inner steps of the run's batch can
consume (`tokens_cap`). A cluster holds one push ticket at a time (a new request forgets the old one)
and a ticket not committed within `ticket_ttl_s` expires: the shards forget what it staged.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from h2.core.dips import DipsConfig
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from h2.ps import penalty
from h2.ps.auth import Credential, Guard, cluster_name, curve_keys, shard_name
from h2.ps.chunks import ChunkLedger
from h2.ps.layout import assign_layers, model_layers
from h2.ps.rpc import Control, Forbidden, Rejected, Unreachable, serve, wait_until_stopped


@dataclass
class ClusterRecord:
    id: str
    partition: int
    session: str = ""
    active: bool = False
    joined: bool = False  # it joined at least once since the master started
    last_beat: float = 0.0
    tokens: int = 0


@dataclass
class ShardRecord:
    index: int
    control: Control | None = None
    data: str = ""
    alive: bool = False
    last_beat: float = 0.0
    version: int = -1


@dataclass
class Push:
    ticket: int
    cluster: str
    base_version: int
    issued: float
    tokens: int = 0
    loss: float | None = None
    committed: float = 0.0


@dataclass
class Outcome:
    status: str  # applied | rejected | skipped | dropped
    version: int
    round: int
    reason: str = ""


@dataclass
class MasterState:
    """What the master writes after every round and reads back when restarted."""
    version: int = 0
    round: int = 0
    tokens: int = 0
    penalty: dict = field(default_factory=lambda: penalty.PenaltyState().to_dict())
    cluster_tokens: dict = field(default_factory=dict)
    chunks: dict = field(default_factory=dict)  # the chunk ledger's epoch and next chunk (h2.ps.chunks)


def ticket_ttl_s(config: DipsConfig) -> float:
    """How long an issued push ticket may stay uncommitted before it expires."""
    return config.ticket_ttl_s or max(60.0, 4 * config.transfer_timeout_s)


def _try(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except (Rejected, Unreachable) as error:
        return error


class EventLog:
    """`rounds.jsonl`: one JSON object per round and per event; each also printed as one console line."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def write(self, event: str, console: str, **fields) -> None:
        record = {"event": event, "time": time.time(), **fields}
        with self.lock:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            print(f"[master] {console}", flush=True)


class Master:

    def __init__(self, config: DipsConfig, source: str, *, port: int, credential: Credential, resume: bool = False):
        self.config, self.source = config, source
        if credential.run_secret is None:
            raise UserError(f"the master needs the run secret, not the credential of {credential.participant}")
        self.credential = credential
        model = resolve_model(config.model)
        self.layers = model_layers(model)
        self.tokens_cap = config.inner_steps * config.train.global_batch * (config.train.seq_len or model.max_seq_len)
        self.ticket_ttl_s = ticket_ttl_s(config)
        self.assignment = assign_layers(self.layers, config.shards)
        self.dir = os.path.join(config.out, "master")
        os.makedirs(self.dir, exist_ok=True)
        self.state_path = os.path.join(self.dir, "state.json")
        self.state = self._load_state(resume)
        self.penalty = penalty.PenaltyState.from_dict(self.state.penalty)
        self.events = EventLog(os.path.join(config.out, "rounds.jsonl"))
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.clusters = {
            spec.id: ClusterRecord(spec.id, index, tokens=self.state.cluster_tokens.get(spec.id, 0))
            for index, spec in enumerate(config.clusters)
        }
        self.shards = {index: ShardRecord(index) for index in range(config.shards)}
        self.chunks = ChunkLedger(config.chunks_per_cluster * len(self.clusters), **self.state.chunks)
        self.pushes: dict[int, Push] = {}
        self.pending: list[Push] = []
        self.outcomes: dict[int, Outcome] = {}
        self.window_closes = math.inf
        self.stopped = threading.Event()
        self.fanout = ThreadPoolExecutor(max_workers=max(2, config.shards), thread_name_prefix="ps-master-fanout")
        handlers = {
            "Join": self._join, "Beat": self._beat, "RequestPush": self._request_push, "CommitPush": self._commit_push,
            "AwaitRound": self._await_round, "Pulled": self._pulled, "Leave": self._leave,
            "NextChunk": self._next_chunk, "ShardPlan": self._shard_plan, "RegisterShard": self._register_shard,
            "ShardBeat": self._shard_beat, "Status": self._status
        }
        participants = {cluster_name(cid) for cid in self.clusters} | {shard_name(i) for i in self.shards}
        guard = Guard(lambda caller: credential.key_of(caller) if caller in participants else None)
        self.server, self.port = serve(handlers, config.host, port, what="master", guard=guard, max_workers=64)
        resumed = f", resumed at version {self.state.version} round {self.state.round}" if resume else ""
        self.events.write(
            "start", f"mode {config.mode} on {config.host}:{self.port}, {config.shards} shards, "
            f"H={config.inner_steps}{resumed}", mode=config.mode, port=self.port, version=self.state.version,
            round=self.state.round, shards=config.shards)
        self.threads = [
            threading.Thread(target=self._driver, name="ps-rounds", daemon=True),
            threading.Thread(target=self._monitor, name="ps-heartbeats", daemon=True)
        ]
        for thread in self.threads:
            thread.start()

    # ---- state on disk -----------------------------------------------------------------------------
    def _load_state(self, resume: bool) -> MasterState:
        if not resume:
            return MasterState()
        if not os.path.exists(self.state_path):
            raise UserError(f"{self.state_path}: no master state to resume from")
        try:
            with open(self.state_path, encoding="utf-8") as handle:
                return MasterState(**json.load(handle))
        except (json.JSONDecodeError, TypeError) as error:
            raise UserError(f"{self.state_path}: unreadable master state ({error})") from None

    def _save_state(self) -> None:
        self.state.penalty = self.penalty.to_dict()
        self.state.cluster_tokens = {cid: record.tokens for cid, record in self.clusters.items()}
        self.state.chunks = self.chunks.to_dict()
        temporary = f"{self.state_path}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.state.__dict__, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.state_path)

    @property
    def finished(self) -> bool:
        return 0 < self.config.tokens <= self.state.tokens

    # ---- clusters ----------------------------------------------------------------------------------
    def _cluster(self, request: dict, caller: str, *, session: bool = True) -> ClusterRecord:
        """The record of the cluster the request names, which must be the caller; with `session`, the
        request must also carry the cluster's current session."""
        cid = str(request["cluster"])
        record = self.clusters.get(cid)
        if record is None:
            raise Rejected(f"unknown cluster '{cid}' ({self.source} lists: {', '.join(self.clusters) or 'none'})")
        if caller != cluster_name(cid):
            raise Forbidden(f"{caller} cannot speak for cluster '{cid}'")
        if session:
            if request.get("session") != record.session or not record.session:
                raise Rejected(f"cluster '{cid}': session {request.get('session')} is not current (join again)")
            if not record.active:
                raise Rejected(f"cluster '{cid}' was dropped (missed heartbeats): join again")
        return record

    def routes(self) -> list[dict]:
        owner = {name: shard for shard, names in enumerate(self.assignment) for name in names}
        keys = {shard: curve_keys(self.credential.key_of(shard_name(shard)))[0].decode() for shard in self.shards}
        return [{
            "index": i, "layer": layer.name, "shard": owner[layer.name], "address": self.shards[owner[layer.name]].data,
            "server_key": keys[owner[layer.name]]
        } for i, layer in enumerate(self.layers)]

    def _join(self, request: dict, caller: str) -> dict:
        with self.lock:
            record = self._cluster(request, caller, session=False)
            if not all(shard.alive for shard in self.shards.values()):
                raise Rejected("the run is not ready: not every shard has registered yet")
            rejoin = bool(record.session)
            abandoned = []
            if record.active and rejoin:
                abandoned = self._drop(record,
                                       "joined again while its session was live (a restarted process replaces it)")
            record.session = f"{random.getrandbits(48):x}"
            record.active, record.joined, record.last_beat = True, True, time.monotonic()
            self.events.write(
                "join", f"cluster {record.id} {'rejoined' if rejoin else 'joined'}; it starts from "
                f"version {self.state.version}", cluster=record.id, version=self.state.version, rejoin=rejoin)
            self.changed.notify_all()
            reply = {
                "session": record.session, "partition": record.partition, "partitions": len(
                    self.clusters), "chunks": self.chunks.count, "inner_steps": self.config.inner_steps,
                "heartbeat_s": self.config.heartbeat_s, "version": self.state.version, "routes": self.routes(),
                "model": self.config.model, "eval_sequences": self.config.eval_sequences,
                "transfer_timeout_s": self.config.transfer_timeout_s, "sync_retry_s": self.config.sync_retry_s,
                "finished": self.finished, "mode": self.config.mode, "seed": self.config.seed,
                "outer": self._outer_options()
            }
        self._forget(abandoned)
        return reply

    def _beat(self, request: dict, caller: str) -> dict:
        with self.lock:
            record = self._cluster(request, caller)
            record.last_beat = time.monotonic()
            return {"finished": self.finished, "version": self.state.version}

    def _request_push(self, request: dict, caller: str) -> dict:
        with self.lock:
            record = self._cluster(request, caller)
            record.last_beat = time.monotonic()
            lost = [shard.index for shard in self.shards.values() if not shard.alive]
            if lost:
                return {"status": "skip", "reason": f"shard {lost[0]} is lost"}
            superseded = [t for t, push in self.pushes.items() if push.cluster == record.id and not push.committed]
            for old in superseded:  # one ticket per cluster at a time: an abandoned push is forgotten
                self.pushes.pop(old)
            ticket = random.getrandbits(62)
            pushing = sum(1 for push in self.pushes.values() if not push.committed)
            self.pushes[ticket] = Push(ticket, record.id, int(request["base_version"]), time.monotonic())
            shards = list(self.shards.values())
        if superseded:
            self._forget(superseded)
        try:
            list(self.fanout.map(lambda shard: shard.control.call("Expect", ticket=ticket, cluster=record.id), shards))
        except (Rejected, Unreachable) as error:
            with self.lock:
                self.pushes.pop(ticket, None)
            return {"status": "skip", "reason": f"announcing the push failed: {error}"}
        # Stagger: concurrent pushers start on different shards.
        offset = pushing % len(shards)
        order = sorted(self.routes(), key=lambda route: ((route["shard"] - offset) % len(shards), route["index"]))
        return {
            "status": "push", "ticket": ticket, "order": [route["index"] for route in order], "routes": self.routes()
        }

    def _commit_push(self, request: dict, caller: str) -> dict:
        ticket = int(request["ticket"])
        claimed = int(request["tokens"])
        loss = request.get("loss")
        if claimed < 0:
            raise Rejected(f"tokens must be 0 or positive, got {claimed}")
        if loss is not None and not isinstance(loss, (int, float)):
            raise Rejected(f"loss must be a number or null, got {type(loss).__name__}")
        with self.lock:
            record = self._cluster(request, caller)
            push = self.pushes.get(ticket)
            if push is None or push.cluster != record.id:
                raise Rejected(f"cluster '{record.id}': ticket {ticket} is unknown (master restarted or push dropped)")
            if push.committed:
                raise Rejected(f"cluster '{record.id}': ticket {ticket} is already committed")
            shards = list(self.shards.values())
        try:
            missing = [
                reply["missing"]
                for reply in self.fanout.map(lambda shard: shard.control.call("Holds", tickets=[ticket]), shards)
            ]
        except (Rejected, Unreachable) as error:
            return {"status": "skip", "reason": f"commit check failed: {error}"}
        incomplete = [f"shard {shard.index}: {', '.join(m[str(ticket)])}" for shard, m in zip(shards, missing) if m]
        if incomplete:
            return {"status": "skip", "reason": f"push incomplete ({incomplete[0]})"}
        tokens = min(claimed, self.tokens_cap)
        if tokens < claimed:
            self.events.write(
                "tokens_capped", f"cluster {record.id} claimed {claimed:,} tokens for one push; counted "
                f"{tokens:,} (H x batch x sequence length)", cluster=record.id, claimed=claimed, counted=tokens)
        with self.lock:
            if self.pushes.get(ticket) is not push:
                return {"status": "skip", "reason": f"ticket {ticket} expired or was replaced while committing"}
            push.tokens, push.loss, push.committed = tokens, loss, time.monotonic()
            self.pending.append(push)
            self.window_closes = push.committed + self.config.window_s
            self.changed.notify_all()
        return {"status": "committed"}

    def _await_round(self, request: dict, caller: str) -> dict:
        ticket = int(request["ticket"])
        deadline = time.monotonic() + min(float(request.get("wait_s", 5.0)), 30.0)
        with self.lock:
            record = self._cluster(request, caller)
            if ticket in self.pushes and self.pushes[ticket].cluster != record.id:
                raise Forbidden(f"ticket {ticket} was not issued to cluster '{record.id}'")
            while ticket not in self.outcomes:
                if ticket not in self.pushes:
                    return {
                        "status": "skipped", "version": self.state.version, "round": self.state.round,
                        "reason": "unknown ticket (master restarted?)", "finished": self.finished
                    }
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"status": "pending", "finished": self.finished}
                self.changed.wait(remaining)
            outcome = self.outcomes.pop(ticket)
            self.pushes.pop(ticket, None)
            return {
                "status": outcome.status, "version": outcome.version, "round": outcome.round, "reason": outcome.reason,
                "finished": self.finished, "routes": self.routes()
            }

    def _leave(self, request: dict, caller: str) -> dict:
        with self.lock:
            record = self._cluster(request, caller)
            record.active, record.session = False, ""
            waiting = {push.ticket for push in self.pending if push.cluster == record.id}
            self.pending = [push for push in self.pending if push.cluster != record.id]
            abandoned = [
                t for t, push in self.pushes.items()
                if push.cluster == record.id and (t in waiting or not push.committed)
            ]
            for ticket in abandoned:
                self.pushes.pop(ticket)
            self.events.write("leave", f"cluster {record.id} left the run", cluster=record.id)
            self.changed.notify_all()
        self._forget(abandoned)
        return {}

    def _next_chunk(self, request: dict, caller: str) -> dict:
        """The next chunk of data for the calling cluster (a dropped one too: it reads on until it rejoins)."""
        with self.lock:
            record = self._cluster(request, caller, session=False)
            if not self.chunks.count:
                raise Rejected("this run hands out no chunks (chunks_per_cluster is 0)")
            chunk = self.chunks.take()
            self._save_state()
        self.events.write("chunk", f"cluster {record.id} reads chunk {chunk.index} of epoch {chunk.epoch}",
                          cluster=record.id, epoch=chunk.epoch, chunk=chunk.index, chunks=chunk.count)
        return {"epoch": chunk.epoch, "chunk": chunk.index, "chunks": chunk.count}

    def _pulled(self, request: dict, caller: str) -> dict:
        with self.lock:
            record = self._cluster(request, caller)
        self.events.write(
            "pull", f"cluster {record.id} pulled version {request['version']} in "
            f"{float(request['pull_s']):.3f} s", cluster=record.id, version=int(request["version"]),
            pull_s=float(request["pull_s"]), bytes=int(request.get("bytes", 0)))
        return {}

    # ---- shards ------------------------------------------------------------------------------------
    def _shard(self, request: dict, caller: str) -> ShardRecord:
        index = int(request["index"])
        if index not in self.shards:
            raise Rejected(f"unknown shard {index} ({self.source} has shards 0..{self.config.shards - 1})")
        if caller != shard_name(index):
            raise Forbidden(f"{caller} cannot speak for shard {index}")
        return self.shards[index]

    def _shard_plan(self, request: dict, caller: str) -> dict:
        shard = self._shard(request, caller)
        return {
            "layers": self.assignment[shard.index], "model": self.config.model, "seed": self.config.seed,
            "version": self.state.version, "heartbeat_s": self.config.heartbeat_s, "outer": self._outer_options(),
            "reduce_only": self.config.rules.decentralized, "snapshot_dir": os.path.join(
                self.config.out, "shards", f"shard-{shard.index}"), "clients": {
                    curve_keys(self.credential.key_of(cluster_name(cid)))[0].decode(): cluster_name(cid)
                    for cid in self.clusters
                }, "max_tickets": 2 * len(self.clusters) + 2, "ticket_ttl_s": self.ticket_ttl_s
        }

    def _outer_options(self) -> dict:
        o = self.config.outer
        return {"optimizer": o.optimizer, "lr": o.lr, "momentum": o.momentum}

    def _register_shard(self, request: dict, caller: str) -> dict:
        with self.lock:
            shard = self._shard(request, caller)
            version = int(request["version"])
            tickets = [push.ticket for push in self.pushes.values()]
            if version != self.state.version:  # it missed a commit (or the master restarted mid-round)
                return {"reload": self.state.version, "tickets": tickets}
            if shard.alive:
                self._lose_shard(shard, "registered again while alive (a restarted process replaces it)")
            if shard.control is not None:
                shard.control.close()
            signer = self.credential.signer(shard_name(shard.index))
            shard.control, shard.data = Control(str(request["control"]), signer), str(request["data"])
            was_lost = shard.version >= 0
            shard.alive, shard.last_beat, shard.version = True, time.monotonic(), version
            self.events.write("shard", f"shard {shard.index} {'re' if was_lost else ''}registered at version {version}",
                              shard=shard.index, version=version, rejoin=was_lost)
            self.changed.notify_all()
        return {"version": self.state.version, "tickets": tickets}

    def _shard_beat(self, request: dict, caller: str) -> dict:
        with self.lock:
            shard = self._shard(request, caller)
            if not shard.alive:
                raise Rejected(f"shard {shard.index} is not registered here: register again")
            shard.last_beat = time.monotonic()
        return {}

    def _status(self, request: dict, caller: str) -> dict:
        with self.lock:
            return {
                "mode": self.config.mode, "version": self.state.version, "round": self.state.round,
                "tokens": self.state.tokens, "finished": self.finished, "clusters": {
                    cid: {"active": r.active, "tokens": r.tokens} for cid, r in self.clusters.items()
                }, "shards": {str(i): {"alive": s.alive, "data": s.data}
                              for i, s in self.shards.items()}, "pending": [push.cluster for push in self.pending]
            }

    # ---- heartbeats --------------------------------------------------------------------------------
    def _monitor(self) -> None:
        limit = self.config.missed_beats * self.config.heartbeat_s
        while not self.stopped.wait(self.config.heartbeat_s / 2):
            now = time.monotonic()
            forget = []
            with self.lock:
                for record in self.clusters.values():
                    if record.active and now - record.last_beat > limit:
                        forget += self._drop(record, f"missed {self.config.missed_beats} heartbeats")
                for shard in self.shards.values():
                    if shard.alive and now - shard.last_beat > limit:
                        self._lose_shard(shard, f"missed {self.config.missed_beats} heartbeats")
                expired = [
                    push for push in self.pushes.values()
                    if not push.committed and now - push.issued > self.ticket_ttl_s
                ]
                for push in expired:
                    self.pushes.pop(push.ticket)
                    self.events.write(
                        "ticket_expired", f"cluster {push.cluster}'s ticket expired uncommitted after "
                        f"{self.ticket_ttl_s:g} s: the shards forget what it staged", cluster=push.cluster)
                forget += [push.ticket for push in expired]
            self._forget(forget)

    def _drop(self, record, reason: str) -> list[int]:
        """Forget a cluster's session and whatever it had pending; the caller holds the lock and then has
        the shards forget the tickets returned."""
        record.active = False
        dropped = [push for push in self.pending if push.cluster == record.id]
        self.pending = [push for push in self.pending if push.cluster != record.id]
        tickets = [push.ticket for push in self.pushes.values() if push.cluster == record.id]
        for ticket in tickets:
            self.pushes.pop(ticket)
        self.events.write("drop", f"cluster {record.id} dropped: {reason} ({len(dropped)} pending push dropped)",
                          cluster=record.id, pending_dropped=len(dropped), reason=reason)
        self.changed.notify_all()
        return tickets

    def _lose_shard(self, shard: ShardRecord, reason: str) -> None:
        """Mark a shard lost (pushes refused, the round in progress skipped); the caller holds the lock."""
        shard.alive = False
        self.events.write("shard_lost", f"shard {shard.index} lost: {reason}", shard=shard.index, reason=reason)
        self.changed.notify_all()

    # ---- rounds ------------------------------------------------------------------------------------
    def _round_ready(self) -> bool:
        if not self.pending:
            return False
        if self.config.rules.round_closes == "all":
            return self._sync_round_ready()
        return time.monotonic() >= self.window_closes

    def _sync_round_ready(self) -> bool:
        """Sync: every cluster of the run file has joined (once), and every active one committed. A cluster
        dropped later (missed heartbeats, left) is no longer waited for: its rounds then differ from a run
        where it stayed."""
        if not all(record.joined for record in self.clusters.values()):
            return False
        active = {cid for cid, record in self.clusters.items() if record.active}
        return active <= {push.cluster for push in self.pending}

    def _run_file_order(self, push: Push) -> int:
        """A round sums its pushes in the run file's cluster order, not their arrival order (float sums
        then do not depend on timing)."""
        return self.clusters[push.cluster].partition

    def _driver(self) -> None:
        while not self.stopped.is_set():
            with self.lock:
                while not self._round_ready() and not self.stopped.is_set():
                    timeout = self.window_closes - time.monotonic() if self.pending else 1.0
                    self.changed.wait(max(0.01, min(timeout, 1.0)))
                if self.stopped.is_set():
                    return
                batch, self.pending = sorted(self.pending, key=self._run_file_order), []
                self.window_closes = math.inf
                self.state.round += 1
                round_id = self.state.round
            self._run_round(round_id, batch)

    def _on_shards(self, method: str, **request) -> list[dict]:
        shards = list(self.shards.values())
        if not all(shard.alive for shard in shards):
            lost = next(shard.index for shard in shards if not shard.alive)
            raise Unreachable(f"shard {lost} is lost")
        return list(self.fanout.map(lambda shard: shard.control.call(method, timeout_s=60.0, **request), shards))

    def _run_round(self, round_id: int, batch: list[Push]) -> None:
        started = time.monotonic()
        tickets = [push.ticket for push in batch]
        by_cluster = {push.cluster: push for push in batch}
        base = self.state.version
        try:
            grams_by_ticket = [reply["gram"] for reply in self._on_shards("Measure", tickets=tickets)]
            names = {str(push.ticket): push.cluster for push in batch}
            grams = [{names[a]: {names[b]: value for b, value in row.items()} for a, row in gram.items()}
                     for gram in grams_by_ticket]
            p = self.config.penalty
            verdict = penalty.judge(self.penalty, grams, {push.cluster: push.tokens for push in batch}, alpha=p.alpha,
                                    beta=p.beta, clip_norm=p.clip_norm, warmup_scores=p.warmup_scores,
                                    penalize=self.config.uses_penalty)
            measured = time.monotonic()
            version = base
            if verdict.accepted:
                weights = {str(by_cluster[cid].ticket): weight for cid, weight in verdict.weights.items()}
                self._on_shards("Prepare", round=round_id, weights=weights, clip=verdict.clip)
                version = base + 1
                with self.lock:
                    self.state.version = version
                    for cid in verdict.accepted:
                        self.clusters[cid].tokens += by_cluster[cid].tokens
                    self.state.tokens += sum(by_cluster[cid].tokens for cid in verdict.accepted)
                    self._save_state()
                self._commit_everywhere(round_id, version)
            else:
                with self.lock:
                    self._save_state()
        except (Rejected, Unreachable) as error:
            self._skip_round(round_id, batch, str(error))
            return
        self._forget(tickets)
        updated = time.monotonic()
        nbytes = sum(layer.nbytes for layer in self.layers)
        rejected = {cid: {"reason": why, "score": verdict.scores[cid]} for cid, why in verdict.rejected.items()}
        staleness = {push.cluster: base - push.base_version for push in batch}
        push_s = {push.cluster: round(push.committed - push.issued, 4) for push in batch}
        losses = {push.cluster: push.loss for push in batch}
        rejected_text = "".join(f", rejected {cid} ({info['reason']})" for cid, info in rejected.items())
        self.events.write(
            "round", f"round {round_id} -> version {version}: {', '.join(verdict.accepted) or 'nobody'} accepted"
            f"{rejected_text}; "
            f"staleness {staleness}; update {updated - measured:.3f} s; tokens {self.state.tokens:,}" +
            (" (finished)" if self.finished else ""), round=round_id, version=version, mode=self.config.mode,
            participants=[push.cluster for push in batch], accepted=verdict.accepted, rejected=rejected,
            norms=verdict.norms, scores=verdict.scores, weights=verdict.weights, update_norm=verdict.update_norm,
            clip=verdict.clip, staleness=staleness, losses=losses, push_s=push_s, measure_s=round(
                measured - started, 4), update_s=round(updated - measured, 4), bytes_pushed=nbytes * len(batch),
            bytes_to_pull=nbytes * len(batch), tokens=self.state.tokens, finished=self.finished)
        # The run's log holds the round before any participant hears its outcome (and can end the run).
        with self.lock:
            for push in batch:
                status = "rejected" if push.cluster in verdict.rejected else "applied"
                self.outcomes[push.ticket] = Outcome(status, version, round_id, verdict.rejected.get(push.cluster, ""))
            self.changed.notify_all()

    def _commit_everywhere(self, round_id: int, version: int) -> None:
        """The version is recorded: a shard that misses its Commit loads that version's snapshot (written
        in Prepare) when it registers again, so the round stands."""
        for shard, outcome in zip(
                self.shards.values(),
                self.fanout.map(lambda shard: _try(shard.control.call, "Commit", round=round_id),
                                list(self.shards.values()))):
            if isinstance(outcome, Exception):
                with self.lock:
                    shard.alive = False
                self.events.write(
                    "shard_lost", f"shard {shard.index} missed the commit of version {version} "
                    f"({outcome}): it reloads that snapshot when it registers again", shard=shard.index,
                    version=version)

    def _forget(self, tickets: list[int], round_id: int | None = None) -> None:
        if not tickets:
            return
        for shard in list(self.shards.values()):
            if shard.alive and shard.control is not None:
                try:
                    shard.control.call("Forget", tickets=tickets, round=round_id)
                except (Rejected, Unreachable):
                    pass

    def _skip_round(self, round_id: int, batch: list[Push], reason: str) -> None:
        self._forget([push.ticket for push in batch], round_id)
        with self.lock:
            for push in batch:
                self.outcomes[push.ticket] = Outcome("skipped", self.state.version, round_id, reason)
            self.changed.notify_all()
        self.events.write(
            "skip", f"round {round_id} skipped: {reason}; {', '.join(p.cluster for p in batch)} "
            f"keep training from their own parameters", round=round_id, reason=reason,
            participants=[push.cluster for push in batch])

    def serve_forever(self) -> None:
        wait_until_stopped(self.stopped)
        self.close()

    def close(self) -> None:
        self.stopped.set()
        with self.lock:
            self.changed.notify_all()
        self.server.stop(0)
        for thread in self.threads:
            thread.join(timeout=5)
        self.events.write("stop", f"stopped at version {self.state.version}, round {self.state.round}",
                          version=self.state.version, round=self.state.round)
