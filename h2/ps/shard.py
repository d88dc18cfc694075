"""A shard server: its layers of the global model and their outer-optimizer state, served on the data
flow (ZeroMQ, h2.ps.datapath) and driven by the master on the control flow (gRPC, h2.ps.rpc).

Lifecycle: ask the master for its plan (which layers, which model, the committed version), load that
version's snapshot (or build version 0 from the run's seed), open the data flow, register, then beat.
A round on the shard: the master announces each push's ticket (`Expect`); clusters push layers;
`Holds` answers the two-stage commit's check; `Measure` returns the Gram matrix of the pseudo-
gradients Δ_j = θ - θ_j of its layers (θ: the global model now, Algorithm 1); `Prepare` computes the
next version out of place (weighted average, clip, outer step; one thread per layer) and writes its
snapshot; `Commit` makes it current, `Abort` forgets it. The previous version stays pullable.

In mode async-diloco (`reduce_only`) a shard holds no model and no outer optimizer: the clusters push their
pseudo-gradients (each against its own copy of the global model), `Measure` takes their Gram matrix as
pushed, and a version is the weighted average of a round's pseudo-gradients (version 0: zeros), which the
round's clusters pull and apply with their own outer optimizers (the all-reduce of async DiLoCo).

Only the master drives a shard (its control calls are signed under this shard's key, h2.ps.auth), and
only the run's clusters reach its data flow (CURVE: the public keys the master's plan lists). A push is
staged only under a ticket the master announced for the pushing cluster; at most `max_tickets` tickets
are staged at once, one that was announced but not completed within `ticket_ttl_s` is dropped, and
when the shard registers (again) it drops every ticket the master does not list (a restarted master
issued none of them).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from h2.core.dips import OuterOptions
from h2.core.errors import RunFailed, UserError, one_line
from h2.core.files import DIGEST_SUFFIX, check_digested, remove_quietly, write_digested
from h2.core.model_config import resolve_model
from h2.ps import outer
from h2.ps.auth import MASTER, Credential, Guard, cluster_name
from h2.ps.datapath import CurveServer, LayerServer, Refused
from h2.ps.layout import Layer, flatten, initial_model, model_layers
from h2.ps.rpc import Control, Rejected, Unreachable, serve, wait_until_stopped

_SNAPSHOT = re.compile(r"^v(\d+)\.safetensors$")
SNAPSHOT_FORMAT = "h2-ps-snapshot-1"
KEEP_SNAPSHOTS = 3


def log(index: int, message: str) -> None:
    print(f"[shard {index}] {message}", flush=True)


class ShardState:
    """The layers' parameters, momentum and staged pushes, with snapshots on disk."""

    def __init__(self, index: int, layers: list[Layer], options: OuterOptions, snapshot_dir: str, *,
                 max_tickets: int = 8, ticket_ttl_s: float = 120.0, reduce_only: bool = False):
        self.index, self.layers, self.options = index, {layer.name: layer for layer in layers}, options
        self.reduce_only = reduce_only
        self.max_tickets, self.ticket_ttl_s = max_tickets, ticket_ttl_s
        self.snapshot_dir = snapshot_dir
        os.makedirs(snapshot_dir, exist_ok=True)
        self.lock = threading.Lock()
        self.version = 0
        self.params: dict[str, torch.Tensor] = {}
        self.momentum: dict[str, torch.Tensor | None] = {name: None for name in self.layers}
        self.previous: tuple[int, dict[str, torch.Tensor]] | None = None
        self.staged: dict[int, dict[str, torch.Tensor]] = {}
        self.owners: dict[int, tuple[str, float]] = {}  # ticket -> (the cluster it was issued to, when)
        self.held: set[int] = set()  # complete at a commit check: they wait for their round
        self.measured: dict[int, dict[str, torch.Tensor]] = {}
        self.prepared: dict | None = None
        self.threads = ThreadPoolExecutor(max_workers=max(1, len(layers)), thread_name_prefix="ps-layer-math")

    # ---- versions on disk -----------------------------------------------------------------------
    def snapshot_path(self, version: int) -> str:
        return os.path.join(self.snapshot_dir, f"v{version:06d}.safetensors")

    def snapshots(self) -> list[int]:
        return sorted(int(m.group(1)) for name in os.listdir(self.snapshot_dir) if (m := _SNAPSHOT.match(name)))

    def start(self, version: int, model_name: str, seed: int) -> None:
        """Load snapshot `version`, or build version 0 from the run's seed."""
        if version in self.snapshots():
            self.params, self.momentum = self._read(version)
        elif version == 0 and self.reduce_only:
            self.params = {name: torch.zeros(layer.numel, dtype=torch.float32) for name, layer in self.layers.items()}
            self._write(0, self.params, self.momentum)
        elif version == 0:
            tensors = initial_model(model_name, seed)
            self.params = {name: flatten(layer, tensors) for name, layer in self.layers.items()}
            self._write(0, self.params, self.momentum)
        elif os.path.exists(old := os.path.join(self.snapshot_dir, f"v{version:06d}.pt")):
            raise UserError(f"{old}: a snapshot of an earlier H2 (a pickled .pt file), not loaded: H2 no longer "
                            f"unpickles snapshots (continue this run with the H2 that wrote it, or start over)")
        else:
            raise UserError(f"{self.snapshot_dir}: no snapshot of version {version} (have {self.snapshots()})")
        self.version = version

    def _read(self, version: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor | None]]:
        """Snapshot `version`'s parameters and momentum, checked against its SHA-256 before it is read;
        UserError naming the file when it is damaged or not this shard's."""
        from safetensors import safe_open

        path = self.snapshot_path(version)
        check_digested(path)
        try:
            with safe_open(path, framework="pt", device="cpu") as handle:
                meta = json.loads((handle.metadata() or {}).get("h2", "null"))
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        except Exception as error:  # safetensors' own errors: named in one line, not a traceback
            raise UserError(f"{path}: unreadable snapshot ({type(error).__name__}: {one_line(error)})") from None
        if not isinstance(meta, dict) or meta.get("format") != SNAPSHOT_FORMAT or meta.get("version") != version:
            raise UserError(f"{path}: not an H2 snapshot of version {version} (its metadata has no 'h2' of format "
                            f"{SNAPSHOT_FORMAT!r} and that version)")
        for name, layer in self.layers.items():
            held = tensors.get(f"params/{name}")
            if held is None or held.numel() != layer.numel:
                raise UserError(f"{path}: holds no layer {name} of {layer.numel} values (another shard's or model's)")
        return ({name: tensors[f"params/{name}"]
                 for name in self.layers}, {name: tensors.get(f"momentum/{name}") for name in self.layers})

    def _write(self, version: int, params: dict, momentum: dict) -> None:
        """Snapshot `version` (safetensors, its SHA-256 beside it), then drop all but the newest
        KEEP_SNAPSHOTS. A failed write (disk full, I/O error) is a RunFailed naming the file and the
        errno; it leaves no part of `version` and the snapshots before it untouched."""
        from safetensors.torch import save

        tensors = {f"params/{name}": tensor.contiguous() for name, tensor in params.items()}
        tensors.update({
            f"momentum/{name}": tensor.contiguous() for name, tensor in momentum.items() if tensor is not None
        })
        meta = {"format": SNAPSHOT_FORMAT, "version": version, "shard": self.index}
        data = save(tensors, metadata={"h2": json.dumps(meta)})
        try:
            write_digested(self.snapshot_path(version), data)
        except RunFailed as error:
            self._remove(version)
            raise RunFailed(f"shard {self.index}: {error}; {self._previous(version)}") from None
        for old in self.snapshots()[:-KEEP_SNAPSHOTS]:
            self._remove(old)

    def _previous(self, version: int) -> str:
        earlier = [held for held in self.snapshots() if held < version]
        return (f"the previous snapshot {self.snapshot_path(earlier[-1])} is intact"
                if earlier else "no earlier snapshot was written")

    def _remove(self, version: int) -> None:
        path = self.snapshot_path(version)
        remove_quietly(path)
        remove_quietly(path + DIGEST_SUFFIX)

    # ---- data flow ------------------------------------------------------------------------------
    def on_push(self, ticket: int, layer: str, payload: memoryview, sender: str) -> None:
        with self.lock:
            staging = self.staged.get(ticket)
            if staging is None:
                raise Refused(f"push from an unknown cluster: ticket {ticket} was not issued by the master "
                              f"(or its round is over)")
            if self.owners[ticket][0] != sender:
                raise Refused(f"ticket {ticket} was not issued to {sender}")
            vector = staging.get(layer)
            if vector is None:
                vector = staging[layer] = torch.empty(self.layers[layer].numel, dtype=torch.float32)
        vector.numpy()[:] = np.frombuffer(payload, dtype=np.float32)

    def on_pull(self, layer: str, version: int) -> tuple[int, torch.Tensor]:
        with self.lock:
            if version == self.version:
                return version, self.params[layer]
            if self.previous is not None and self.previous[0] == version:
                return version, self.previous[1][layer]
            raise Refused(f"version {version} of layer {layer} is not held (current {self.version})")

    # ---- control flow ---------------------------------------------------------------------------
    def expect(self, ticket: int, owner: str) -> None:
        """Stage pushes of `ticket` from cluster `owner` (its participant name), within the bounds."""
        with self.lock:
            if ticket in self.staged:
                return
            now = time.monotonic()
            for old, (_, since) in list(self.owners.items()):
                if old not in self.held and old not in self.measured and now - since > self.ticket_ttl_s:
                    self._drop(old)
            if len(self.staged) >= self.max_tickets:
                raise Rejected(f"shard {self.index}: {len(self.staged)} push tickets are staged already "
                               f"(at most {self.max_tickets})")
            self.staged[ticket], self.owners[ticket] = {}, (owner, now)

    def keep_only(self, tickets: set[int]) -> None:
        """Drop every staged ticket the master no longer knows (a restarted master issued none of them)."""
        with self.lock:
            for ticket in [t for t in self.staged if t not in tickets]:
                self._drop(ticket)

    def _drop(self, ticket: int) -> None:
        self.staged.pop(ticket, None)
        self.owners.pop(ticket, None)
        self.held.discard(ticket)
        self.measured.pop(ticket, None)

    def missing(self, tickets: list[int]) -> dict[str, list[str]]:
        with self.lock:
            absent = {
                str(t): [name for name in self.layers if name not in self.staged.get(t, {})] for t in tickets
                if t not in self.staged or len(self.staged[t]) < len(self.layers)
            }
            self.held.update(t for t in tickets if t in self.staged and str(t) not in absent)
            return absent

    def measure(self, tickets: list[int]) -> dict[str, dict[str, float]]:
        """<Δ_j, Δ_k> over this shard's layers, Δ_j = θ - θ_j (reduce_only: Δ_j as pushed), for every pair of
        tickets."""
        with self.lock:
            for ticket in tickets:
                if ticket not in self.staged or len(self.staged[ticket]) < len(self.layers):
                    raise Rejected(f"shard {self.index}: ticket {ticket} is not complete here")
            staged = {t: self.staged[t] for t in tickets}
            params = dict(self.params)

        def layer_gram(name: str) -> tuple[dict[int, torch.Tensor], np.ndarray]:
            deltas = {t: staged[t][name] if self.reduce_only else params[name] - staged[t][name] for t in tickets}
            stacked = torch.stack([deltas[t] for t in tickets]).double()
            return deltas, (stacked @ stacked.T).numpy()

        results = list(self.threads.map(layer_gram, list(self.layers)))
        gram = sum(r[1] for r in results)
        with self.lock:
            self.measured = {t: {name: results[i][0][t] for i, name in enumerate(self.layers)} for t in tickets}
        return {str(a): {str(b): float(gram[i, j]) for j, b in enumerate(tickets)} for i, a in enumerate(tickets)}

    def prepare(self, round_id: int, weights: dict[int, float], clip: float) -> int:
        with self.lock:
            if not self.measured or set(weights) - set(self.measured):
                raise Rejected(f"shard {self.index}: round {round_id} was not measured here")
            measured, params, momentum = self.measured, dict(self.params), dict(self.momentum)

        def layer_step(name: str):
            average = sum(weight * measured[t][name] for t, weight in weights.items())
            if self.reduce_only:  # the all-reduce's result: each cluster applies its own outer step
                return clip * average, None
            return outer.stepped(self.options, params[name], momentum[name], clip * average)

        results = dict(zip(self.layers, self.threads.map(layer_step, list(self.layers))))
        new_params = {name: result[0] for name, result in results.items()}
        new_momentum = {name: result[1] for name, result in results.items()}
        version = self.version + 1
        try:
            self._write(version, new_params, new_momentum)
        except RunFailed as error:  # the round is skipped; this shard stays at its version
            log(self.index, str(error))
            raise Rejected(str(error)) from None
        with self.lock:
            self.prepared = {"round": round_id, "version": version, "params": new_params, "momentum": new_momentum}
        return version

    def commit(self, round_id: int) -> int:
        with self.lock:
            if self.prepared is None or self.prepared["round"] != round_id:
                raise Rejected(f"shard {self.index}: round {round_id} was not prepared here")
            self.previous = (self.version, self.params)
            self.params, self.momentum = self.prepared["params"], self.prepared["momentum"]
            self.version = self.prepared["version"]
            self.prepared = None
            self.measured = {}
            return self.version

    def forget(self, tickets: list[int], round_id: int | None = None) -> None:
        """Drop staged pushes (and a prepared round that was abandoned)."""
        with self.lock:
            for ticket in tickets:
                self._drop(ticket)
            if round_id is not None and self.prepared is not None and self.prepared["round"] == round_id:
                version = self.prepared["version"]
                self.prepared = None
                self._remove(version)


class ShardServer:
    """One shard process: its state, its data flow, its control endpoint and its heartbeat."""

    def __init__(self, master: str, index: int, host: str, control_port: int, data_port: int, *, credential: Credential,
                 crash_at_round: int = 0):
        self.index, self.host, self.crash_at_round = index, host, crash_at_round
        self.master = Control(master, credential.signer())
        self.stopped = threading.Event()
        self.failure: UserError | RunFailed | None = None
        log(index, f"asking master {master} for its plan")
        try:
            plan = self.master.call_until("ShardPlan", give_up_s=120, index=index)
        except Rejected as error:
            raise UserError(str(error)) from None
        except Unreachable:
            raise UserError(f"shard {index}: master {master} did not answer for 120 s") from None
        self.heartbeat_s = plan["heartbeat_s"]
        all_layers = model_layers(resolve_model(plan["model"]))
        mine = [layer for layer in all_layers if layer.name in plan["layers"]]
        self.state = ShardState(index, mine, OuterOptions(**plan["outer"]), plan["snapshot_dir"], max_tickets=int(
            plan["max_tickets"]), ticket_ttl_s=float(plan["ticket_ttl_s"]), reduce_only=bool(
                plan.get("reduce_only", False)))
        self.model, self.seed = plan["model"], plan["seed"]
        self.state.start(plan["version"], self.model, self.seed)
        indices = {all_layers.index(layer): layer for layer in mine}
        public, secret = credential.curve
        curve = CurveServer(public, secret, {key.encode(): name for key, name in plan["clients"].items()})
        self.data = LayerServer(host, data_port, indices, on_push=self.state.on_push, on_pull=self.state.on_pull,
                                curve=curve)
        handlers = {
            "Expect": self._expect, "Holds": self._holds, "Measure": self._measure, "Prepare": self._prepare,
            "Commit": self._commit, "Forget": self._forget, "Status": self._status
        }
        guard = Guard(lambda caller: credential.key if caller == MASTER else None)
        self.control, self.control_port = serve(handlers, host, control_port, what=f"shard {index} control flow",
                                                guard=guard)
        self._register()
        log(
            index, f"serving {', '.join(layer.name for layer in mine)} at version {self.state.version}: "
            f"data tcp://{host}:{self.data.port}, control {host}:{self.control_port}")
        self.beat = threading.Thread(target=self._beat_loop, name="ps-shard-beat", daemon=True)
        self.beat.start()

    def _register(self) -> None:
        while True:
            reply = self.master.call_until("RegisterShard", give_up_s=120, index=self.index,
                                           control=f"{self.host}:{self.control_port}",
                                           data=f"tcp://{self.host}:{self.data.port}", version=self.state.version)
            self.state.keep_only({int(t) for t in reply["tickets"]})
            if "reload" not in reply:
                return
            log(
                self.index, f"the run is at version {reply['reload']}, this shard at {self.state.version}: "
                f"loading that snapshot")
            with self.state.lock:
                self.state.prepared = None
                self.state.start(int(reply["reload"]), self.model, self.seed)

    def _beat_loop(self) -> None:
        unreachable_since = None
        while not self.stopped.wait(self.heartbeat_s):
            try:
                self.master.call("ShardBeat", timeout_s=max(1.0, self.heartbeat_s), index=self.index,
                                 version=self.state.version)
                if unreachable_since is not None:
                    log(self.index, f"master is back after {time.monotonic() - unreachable_since:.1f} s")
                    unreachable_since = None
            except Rejected:  # the master restarted and does not know this shard: register again
                log(self.index, "master does not know this shard (restarted?): registering again")
                try:
                    self._register()
                except (Rejected, Unreachable) as error:
                    log(self.index, f"registering failed: {error}")
                except (UserError, RunFailed) as error:  # the run's version cannot be loaded here
                    self.failure = error
                    self.stopped.set()
            except Unreachable:
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                    log(self.index, "master unreachable: retrying")

    # ---- control handlers ------------------------------------------------------------------------
    def _expect(self, request: dict, caller: str) -> dict:
        self.state.expect(int(request["ticket"]), cluster_name(str(request["cluster"])))
        return {}

    def _holds(self, request: dict, caller: str) -> dict:
        return {"missing": self.state.missing([int(t) for t in request["tickets"]])}

    def _measure(self, request: dict, caller: str) -> dict:
        return {"gram": self.state.measure([int(t) for t in request["tickets"]])}

    def _prepare(self, request: dict, caller: str) -> dict:
        round_id = int(request["round"])
        if round_id == self.crash_at_round:
            log(self.index, f"fault injection: exiting while preparing round {round_id}")
            os._exit(3)
        weights = {int(t): float(w) for t, w in request["weights"].items()}
        return {"version": self.state.prepare(round_id, weights, float(request["clip"]))}

    def _commit(self, request: dict, caller: str) -> dict:
        return {"version": self.state.commit(int(request["round"]))}

    def _forget(self, request: dict, caller: str) -> dict:
        round_id = request.get("round")
        self.state.forget([int(t) for t in request["tickets"]], None if round_id is None else int(round_id))
        return {}

    def _status(self, request: dict, caller: str) -> dict:
        return {
            "index": self.index, "version": self.state.version, "layers": list(self.state.layers),
            "refused_frames": self.data.refused
        }

    def serve_forever(self) -> None:
        wait_until_stopped(self.stopped)
        self.close()
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self.stopped.set()
        self.control.stop(0)
        self.data.close()
        log(self.index, f"stopped at version {self.state.version}")
