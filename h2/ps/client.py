"""A cluster's side of a Di-PS run: join, heartbeat, and the sync point every H inner steps.

`ClusterClient` speaks to the master (control flow) and owns the heartbeat thread; `LayerClient`
moves layers to and from the shards (data flow) and is all that a pipeline rank other than the
cluster's first needs. One sync point (`ClusterClient.sync` for a single process; the pipeline
trainer calls the same steps across its ranks):

    request a push ticket -> push the layers -> commit (tokens consumed, mean loss) ->
    await the round -> pull the version it names (applied or rejected) -> report the pull

A round the master skips, a push or commit the PS refuses, or a PS that does not answer makes the
cluster skip this sync point and go on training from its own parameters; if the master dropped it
(missed heartbeats) or restarted, it joins again and pulls the latest version.

In mode async-diloco (the paper's asynchronous DiLoCo on a decentralized architecture) the cluster keeps its
own copy of the global model and its own outer optimizer (`ClusterOuter`): it pushes its pseudo-gradient
Δ = θ_global − θ_local, the round's participants (the clusters that finished their inner phase within the
window) get the weighted average of their Δs (the all-reduce), and each applies it with its own outer step.

A cluster speaks with its credential (h2.ps.auth: `--ps-secret-file` or $H2_PS_SECRET_FILE): its calls
to the master are signed with it, and its CURVE key pair for the shards is derived from it; every rank
of a pipeline cluster derives the same pair (`cluster_curve`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from h2.core.dips import MODE_RULES, OuterOptions
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from h2.ps import outer
from h2.ps.auth import Credential, cluster_name, load_credential
from h2.ps.chunks import Chunk
from h2.ps.datapath import CurveClient, DataFlowError, Route, pull_layers, push_layers
from h2.ps.layout import Layer, initial_model, model_layers, unflatten
from h2.ps.rpc import Control, Rejected, Unreachable

GIVE_UP_S = 120.0


def sync_retries(retry_s: float, heartbeat_s: float) -> int:
    """How many times a skipped sync point is tried again, one heartbeat apart, before the cluster trains on.
    A count, not a clock, so every rank of a pipeline cluster makes the same choice."""
    return int(retry_s / heartbeat_s)


def sync_retrying(sync_once: Callable[[], "SyncResult"], retries: int, wait_s: float,
                  on_skipped: Callable[["SyncResult"], None]) -> "SyncResult":
    """A sync point tried again `retries` times, `wait_s` apart, while it is skipped and the run goes on;
    every skipped attempt but the last goes to `on_skipped`."""
    result = sync_once()
    for _ in range(retries):
        if result.status != "skipped" or result.finished:
            break
        on_skipped(result)
        time.sleep(wait_s)
        result = sync_once()
    return result


@dataclass
class SyncResult:
    status: str  # applied | rejected | skipped
    version: int
    round: int = 0
    reason: str = ""
    push_s: float = 0.0
    wait_s: float = 0.0
    pull_s: float = 0.0
    bytes_pushed: int = 0
    bytes_pulled: int = 0
    finished: bool = False


def cluster_credential(cluster_id: str, secret_file: str | None) -> Credential:
    """Cluster `cluster_id`'s credential from `secret_file` or $H2_PS_SECRET_FILE (one line if neither)."""
    return load_credential(secret_file, cluster_name(cluster_id), "--ps-secret-file")


def cluster_curve(credential: Credential) -> CurveClient:
    return CurveClient(*credential.curve)


class LayerClient:
    """Pushes and pulls named full-model tensors to and from the shards that hold their layers (as the
    client whose CURVE keys are `curve`)."""

    def __init__(self, routes: list[dict], layers: list[Layer], curve: CurveClient, timeout_s: float = 30.0):
        self.timeout_s, self.curve = timeout_s, curve
        self.routes = {
            r["index"]: Route(r["index"], layers[r["index"]], r["address"], r["server_key"].encode()) for r in routes
        }
        self.by_name = {route.layer.name: route for route in self.routes.values()}

    def routes_for(self, layer_names: list[str], order: list[int] | None = None) -> list[Route]:
        wanted = set(layer_names)
        indices = order if order is not None else sorted(self.routes)
        return [self.routes[i] for i in indices if self.routes[i].layer.name in wanted]

    def push(self, ticket: int, tensors: dict[str, torch.Tensor], layer_names: list[str], order: list[int] | None,
             transform: Callable[[Layer, torch.Tensor], torch.Tensor] | None = None) -> int:
        return push_layers(self.routes_for(layer_names, order), ticket, tensors, transform=transform, curve=self.curve,
                           timeout_s=self.timeout_s)

    def pull(self, version: int, tensors: dict[str, torch.Tensor], layer_names: list[str]) -> int:

        def write(layer: Layer, vector: torch.Tensor) -> None:
            with torch.no_grad():
                for name, value in unflatten(layer, vector).items():
                    tensors[name].copy_(value)

        return pull_layers(self.routes_for(layer_names), version, write, curve=self.curve, timeout_s=self.timeout_s)


@dataclass
class Outliers:
    """Fault injection: on every `every`-th push, push base - scale * (base - local) (or NaN)."""
    kind: str = "none"
    every: int = 1
    scale: float = 100.0
    pushes: int = 0
    base: dict[str, torch.Tensor] = field(default_factory=dict)

    def remember(self, layers: list[Layer], tensors: dict[str, torch.Tensor]) -> None:
        if self.kind == "scale":
            self.base = {
                name: tensors[name].detach().to("cpu", torch.float32).clone() for layer in layers
                for name, _ in layer.params
            }

    def transform_for_this_push(self) -> Callable[[Layer, torch.Tensor], torch.Tensor] | None:
        self.pushes += 1
        if self.kind == "none" or self.pushes % self.every:
            return None
        if self.kind == "nan":
            return lambda layer, vector: torch.full_like(vector, math.nan)

        def scaled(layer: Layer, vector: torch.Tensor) -> torch.Tensor:
            base = torch.cat([self.base[name].reshape(-1) for name, _ in layer.params])
            return base - self.scale * (base - vector)

        return scaled


class ClusterOuter:
    """Async DiLoCo's decentralized outer optimizer: this cluster's own copy of the global model and its own
    outer momentum (torch.optim.SGD's arithmetic, h2.ps.outer), stepped with each all-reduced pseudo-gradient."""

    def __init__(self, options: OuterOptions, tensors: dict[str, torch.Tensor]):
        self.options = options
        self.model = {name: tensor.detach().to("cpu", torch.float32).clone() for name, tensor in tensors.items()}
        self.momentum: dict[str, torch.Tensor | None] = {name: None for name in self.model}

    def pseudo_gradient(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Δ = θ_global − θ_local: what this cluster pushes (the sign of Algorithm 1's Δ)."""
        return {name: self.model[name] - tensors[name].detach().to("cpu", torch.float32) for name in self.model}

    def step(self, average: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> None:
        """One step of this cluster's outer optimizer on `average`; the local model restarts from the new copy."""
        with torch.no_grad():
            for name in self.model:
                self.model[name], self.momentum[name] = outer.stepped(self.options, self.model[name],
                                                                      self.momentum[name], average[name])
                tensors[name].copy_(self.model[name])


class ClusterClient:

    def __init__(self, address: str, cluster_id: str, *, log: Callable[[str], None] = print, outliers: Outliers
                 | None = None, secret_file: str | None = None, credential: Credential | None = None):
        self.address, self.cluster_id, self.log = address, cluster_id, log
        self.credential = credential or cluster_credential(cluster_id, secret_file)
        self.curve = cluster_curve(self.credential)
        self.master = Control(address, self.credential.signer())
        self.outliers = outliers or Outliers()
        self.needs_rejoin = False
        self.finished = False
        self.outer: ClusterOuter | None = None  # mode async-diloco: this cluster's global model and optimizer
        self.stopped = threading.Event()
        self.join()
        self.beat = threading.Thread(target=self._beat_loop, name="ps-cluster-beat", daemon=True)
        self.beat.start()

    def join(self) -> dict:
        try:
            reply = self.master.call_until("Join", give_up_s=GIVE_UP_S, retry_s=0.5, cluster=self.cluster_id)
        except Rejected as error:
            if "not ready" in str(error):
                return self._join_when_ready()
            raise UserError(f"--ps {self.address}: {error}") from None
        except Unreachable:
            raise UserError(f"--ps {self.address}: the master did not answer for {GIVE_UP_S:g} s") from None
        self.session, self.version = reply["session"], reply["version"]
        self.partition, self.partitions, self.chunks = reply["partition"], reply["partitions"], reply["chunks"]
        self.inner_steps, self.heartbeat_s = reply["inner_steps"], reply["heartbeat_s"]
        self.model, self.eval_sequences = reply["model"], reply["eval_sequences"]
        self.model_layers = model_layers(resolve_model(self.model))
        self.transfer_timeout_s = reply["transfer_timeout_s"]
        self.sync_retries = sync_retries(reply["sync_retry_s"], reply["heartbeat_s"])
        self.follow(reply["routes"])
        self.finished = reply["finished"]
        self.decentralized = MODE_RULES[reply["mode"]].decentralized
        self.outer_options, self.seed = OuterOptions(**reply["outer"]), int(reply["seed"])
        self.needs_rejoin = False
        return reply

    def follow(self, routes: list[dict]) -> None:
        """Use the shards' current addresses (a restarted shard listens on a new port)."""
        self.layers = LayerClient(routes, self.model_layers, self.curve, self.transfer_timeout_s)

    def _join_when_ready(self) -> dict:
        deadline = time.monotonic() + GIVE_UP_S
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                return self.join()
            except UserError:
                continue
        raise UserError(f"--ps {self.address}: the run did not become ready in {GIVE_UP_S:g} s")

    def _beat_loop(self) -> None:
        unreachable_since = None
        while not self.stopped.wait(self.heartbeat_s):
            try:
                reply = self.master.call("Beat", timeout_s=max(1.0, self.heartbeat_s), cluster=self.cluster_id,
                                         session=self.session)
                self.finished = reply["finished"]
                if unreachable_since is not None:
                    self.log(f"master is back after {time.monotonic() - unreachable_since:.1f} s")
                    unreachable_since = None
            except Rejected as error:
                if not self.needs_rejoin:
                    self.log(f"{error}: joining again at the next sync point")
                self.needs_rejoin = True
            except Unreachable:
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                    self.log("master unreachable: training on, retrying")

    def call(self, method: str, **request) -> dict:
        return self.master.call_until(method, give_up_s=GIVE_UP_S, cluster=self.cluster_id, session=self.session,
                                      **request)

    # ---- the steps of a sync point (the pipeline trainer runs them on different ranks) ----------
    def request_push(self) -> dict:
        reply = self.call("RequestPush", base_version=self.version)
        if "routes" in reply:
            self.follow(reply["routes"])
        return reply

    def commit(self, ticket: int, tokens: int, loss: float | None) -> dict:
        return self.call("CommitPush", ticket=ticket, tokens=tokens, loss=loss)

    def await_round(self, ticket: int) -> dict:
        while True:
            reply = self.call("AwaitRound", ticket=ticket, wait_s=5.0)
            self.finished = reply.get("finished", self.finished)
            if "routes" in reply:
                self.follow(reply["routes"])
            if reply["status"] != "pending":
                return reply

    def next_chunk(self) -> Chunk:
        """The next chunk of the run's data this cluster reads (h2.ps.chunks)."""
        reply = self.master.call_until("NextChunk", give_up_s=GIVE_UP_S, cluster=self.cluster_id)
        return Chunk(int(reply["epoch"]), int(reply["chunk"]), int(reply["chunks"]))

    def report_pull(self, version: int, pull_s: float, nbytes: int) -> None:
        try:
            self.call("Pulled", version=version, pull_s=pull_s, bytes=nbytes)
        except (Rejected, Unreachable):
            pass

    # ---- one process holding the whole model -----------------------------------------------------
    def pull_all(self, tensors: dict[str, torch.Tensor], version: int) -> int:
        names = [route.layer.name for route in self.layers.routes.values()]
        nbytes = self.layers.pull(version, tensors, names)
        self.version = version
        self.outliers.remember(list(self.layers.by_name[n].layer for n in names), tensors)
        return nbytes

    def start(self, tensors: dict[str, torch.Tensor], fresh: bool) -> int:
        """At this process's first join, take the global model into `tensors`; the bytes pulled. In mode
        async-diloco nothing is pulled: a `fresh` cluster builds version 0 from the run's seed (the same on
        every cluster), a resumed one keeps its own parameters, and either starts its own outer optimizer."""
        if not self.decentralized:
            return self.pull_all(tensors, self.version)
        if fresh:
            with torch.no_grad():
                for name, value in initial_model(self.model, self.seed).items():
                    tensors[name].copy_(value)
        self.outer = ClusterOuter(self.outer_options, tensors)
        return 0

    def take_average(self, tensors: dict[str, torch.Tensor], version: int) -> int:
        """Async-diloco: pull the round's averaged pseudo-gradient and apply this cluster's outer step."""
        average = {name: torch.empty_like(value) for name, value in self.outer.model.items()}
        nbytes = self.layers.pull(version, average, [route.layer.name for route in self.layers.routes.values()])
        self.outer.step(average, tensors)
        self.version = version
        return nbytes

    def rejoin_and_pull(self, tensors: dict[str, torch.Tensor]) -> SyncResult:
        reply = self.join()
        if self.decentralized:  # its global model and outer optimizer are its own: nothing to pull
            return SyncResult("rejoined", reply["version"], finished=self.finished)
        started = time.perf_counter()
        nbytes = self.pull_all(tensors, reply["version"])
        return SyncResult("rejoined", reply["version"], pull_s=time.perf_counter() - started, bytes_pulled=nbytes,
                          finished=self.finished)

    def sync(self, tensors: dict[str, torch.Tensor], tokens: int, loss: float | None) -> SyncResult:
        """One sync point for a process that holds every layer (`tensors`: full-model names)."""
        try:
            if self.needs_rejoin:
                return self.rejoin_and_pull(tensors)
            started = time.perf_counter()
            plan = self.request_push()
            if plan["status"] != "push":
                return SyncResult("skipped", self.version, reason=plan["reason"], finished=self.finished)
            names = [route.layer.name for route in self.layers.routes.values()]
            if self.decentralized:
                pushed = self.layers.push(plan["ticket"], self.outer.pseudo_gradient(tensors), names, plan["order"])
            else:
                pushed = self.layers.push(plan["ticket"], tensors, names, plan["order"],
                                          self.outliers.transform_for_this_push())
            committed = self.commit(plan["ticket"], tokens, loss)
            push_s = time.perf_counter() - started
            if committed["status"] != "committed":
                return SyncResult("skipped", self.version, reason=committed["reason"], push_s=push_s,
                                  bytes_pushed=pushed, finished=self.finished)
            outcome = self.await_round(plan["ticket"])
            waited = time.perf_counter()
            result = SyncResult(outcome["status"], outcome["version"], outcome.get("round", 0), outcome.get(
                "reason", ""), push_s=push_s, wait_s=waited - started - push_s, bytes_pushed=pushed,
                                finished=self.finished)
            if outcome["status"] == "applied" and self.decentralized:
                result.bytes_pulled = self.take_average(tensors, outcome["version"])
                result.pull_s = time.perf_counter() - waited
                self.report_pull(outcome["version"], result.pull_s, result.bytes_pulled)
            elif outcome["status"] in ("applied", "rejected"):
                result.bytes_pulled = self.pull_all(tensors, outcome["version"])
                result.pull_s = time.perf_counter() - waited
                self.report_pull(outcome["version"], result.pull_s, result.bytes_pulled)
            return result
        except Rejected as error:
            self.needs_rejoin = True
            return SyncResult("skipped", self.version, reason=str(error), finished=self.finished)
        except (Unreachable, DataFlowError) as error:
            return SyncResult("skipped", self.version, reason=str(error), finished=self.finished)

    def close(self, leave: bool = True) -> None:
        """Stop beating; with `leave`, tell the master this cluster is done (it is not waited for)."""
        self.stopped.set()
        if leave:
            try:
                self.master.call("Leave", timeout_s=2.0, cluster=self.cluster_id, session=self.session)
            except (Rejected, Unreachable):
                pass
        self.master.close()
