"""A HeteroPP pipeline as one cluster of a Di-PS run: every rank pushes and pulls the layers of its own
stage; the cluster's first rank speaks to the master.

At a sync point (every H steps, on every rank at once):
  rank 0 asks the master for a push ticket and hands it to every rank;
  in each stage, the ranks of data-parallel replica 0 gather their TP shards into whole layers
  (heteropp.stage_parameters) and its TP rank 0 pushes them to the shards;
  rank 0 commits once every stage pushed, waits for the round and hands its outcome to every rank;
  every rank pulls its own stage's layers at the version named and keeps its TP slice of them (so
  every DP replica and TP rank ends with the same global model without a broadcast).
A failure anywhere (a push, a pull on any rank) makes the whole cluster skip the sync point: every
rank keeps its own parameters. Rank 0 writes `ps.jsonl` (no held-out score: the pipeline's forward
pass is spread over the ranks).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from h2.core.dips import PSOptions
from h2.core.errors import UserError
from h2.core.model_config import resolve_model
from h2.ps.client import ClusterClient, LayerClient, SyncResult, cluster_credential, cluster_curve, sync_retrying
from h2.ps.datapath import DataFlowError
from h2.ps.layout import layer_of, model_layers
from h2.ps.rpc import Rejected, Unreachable
from h2.train.pacing import Pacer
from h2.train.ps_sync import SyncLog
from heteropp.stage_parameters import gather_full, load_full


def _everyone_ok(ok: bool, group) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _broadcast(value, group):
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


class StageSync:
    """This rank's side of the sync points: which layers its stage holds, and moving them."""

    def __init__(self, trainer, join: dict, options: PSOptions):
        engine = trainer.engine
        self.curve = cluster_curve(cluster_credential(options.cluster_id, options.ps_secret_file))
        self.engine, self.group = engine, engine.groups.everyone
        self.pieces = engine.parameter_pieces()
        layers = self.model_layers = model_layers(resolve_model(join["model"]))
        self.transfer_timeout_s = join["transfer_timeout_s"]
        self.follow(join["routes"])
        self.layer_names = sorted({layer_of(name) for name, _, _ in self.pieces})
        by_name = {layer.name: layer for layer in layers}
        self.buffers = {name: torch.empty(shape) for layer in self.layer_names for name, shape in by_name[layer].params}
        self.pushes = self.engine.place.dp_index == 0
        self.sends = self.pushes and self.engine.place.tp_index == 0

    def follow(self, routes: list[dict]) -> None:
        """Use the shards' current addresses."""
        self.layers = LayerClient(routes, self.model_layers, self.curve, self.transfer_timeout_s)

    def push(self, ticket: int, order: list[int]) -> bool:
        ok = True
        if self.pushes:
            whole = gather_full(self.pieces, self.engine.groups.tp, self.engine.stage_info.tp)
            if self.sends:
                try:
                    self.layers.push(ticket, whole, self.layer_names, order)
                except DataFlowError:
                    ok = False
        return _everyone_ok(ok, self.group)

    def pull(self, version: int) -> bool:
        try:
            self.layers.pull(version, self.buffers, self.layer_names)
            ok = True
        except DataFlowError:
            ok = False
        if _everyone_ok(ok, self.group):
            load_full(self.pieces, self.engine.place.tp_index, self.engine.stage_info.tp, self.buffers)
            return True
        return False


def run_pipeline_with_ps(trainer, options: PSOptions, *, log=print, on_step=lambda record: None) -> list[dict]:
    """Train `trainer` (h2.train.pipeline.PipelineTrainer, on every rank) as one cluster of the run."""
    engine = trainer.engine
    first = engine.rank == 0
    say = (lambda message: log(f"[cluster {options.cluster_id}] {message}")) if first else (lambda message: None)
    client = None
    join = None
    if first:
        client = ClusterClient(options.ps, options.cluster_id, log=say, secret_file=options.ps_secret_file)
        join = {
            "routes": [{"index": route.index, "address": route.address, "server_key": route.server_key.decode()}
                       for route in client.layers.routes.values()], "model": client.model, "version": client.version,
            "inner_steps": client.inner_steps, "partition": client.partition, "partitions": client.partitions,
            "transfer_timeout_s": client.transfer_timeout_s, "sync_retries": client.sync_retries,
            "heartbeat_s": client.heartbeat_s, "decentralized": client.decentralized
        }
    join = _broadcast(join, engine.groups.everyone)
    if join["decentralized"]:
        raise UserError(f"--ps {options.ps}: mode async-diloco runs single-device clusters only, not --strategy "
                        f"pipelines (their stages do not keep the cluster's copy of the global model)")
    if options.outlier != "none":
        raise UserError("--outlier is fault injection for single-device clusters, not for --strategy pipelines")
    if resolve_model(join["model"]).architecture() != trainer.model_config.architecture():
        raise UserError(f"--ps {options.ps}: the run trains model '{join['model']}', this pipeline "
                        f"'{trainer.model_config.name}'")
    trainer.data_partition = (join["partition"], join["partitions"])
    stage = StageSync(trainer, join, options)
    sync_log = SyncLog(trainer.out_dir, append=False) if first else None
    if not stage.pull(join["version"]):
        raise UserError(f"--ps {options.ps}: pulling the global model's version {join['version']} failed")
    pacer = Pacer(options.pace_step_s)
    if options.pace_step_s:
        say(f"emulated cluster speed: every step padded to {options.pace_step_s:g} s by sleeping")
    records, tokens, losses = [], 0, []

    def record_sync(result: SyncResult) -> None:
        if first:
            sync_log.append({
                "step": trainer.step, "time": time.time(), **result.__dict__, "eval_loss": None,
                "pacing_overruns": pacer.overruns
            })
            say(f"step {trainer.step}: {result.status} -> version {result.version}" +
                (f" ({result.reason})" if result.reason else ""))

    try:
        while trainer.step < trainer.config.steps:
            started = time.perf_counter()
            record = trainer.train_step()
            pacer.pad(started)
            records.append(record)
            on_step(record)
            tokens += record["tokens"]
            losses.append(record["loss"] if engine.reports_loss else 0.0)
            if trainer.step % join["inner_steps"]:
                continue
            loss = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64)
            dist.all_reduce(loss, group=engine.groups.everyone)  # only the reporting rank's is not 0
            mean_loss = float(loss.item())
            result = sync_retrying(lambda: _sync_point(client, stage, tokens, mean_loss), join["sync_retries"],
                                   join["heartbeat_s"], record_sync)
            if result.status != "skipped":
                tokens, losses = 0, []
            record_sync(result)
            if result.finished:
                break
    finally:
        if client is not None:
            client.close()
    return records


def _sync_point(client: ClusterClient | None, stage: StageSync, tokens: int, loss: float) -> SyncResult:
    """One sync point on every rank; `client` only on rank 0. The same result on every rank."""
    group = stage.group
    plan = None
    if client is not None:
        try:
            if client.needs_rejoin:
                reply = client.join()
                plan = {"status": "rejoined", "version": reply["version"], "routes": reply["routes"]}
            else:
                plan = client.request_push()
        except (Rejected, Unreachable) as error:
            plan = {"status": "skip", "reason": str(error)}
        plan["finished"] = client.finished
    plan = _broadcast(plan, group)
    if "routes" in plan:
        stage.follow(plan["routes"])
    if plan["status"] == "rejoined":
        ok = stage.pull(plan["version"])
        return SyncResult("rejoined" if ok else "skipped", plan["version"], finished=plan["finished"])
    if plan["status"] != "push":
        return SyncResult("skipped", -1, reason=plan["reason"], finished=plan["finished"])
    started = time.perf_counter()
    pushed = stage.push(plan["ticket"], plan["order"])
    outcome = None
    if client is not None:
        try:
            if not pushed:
                outcome = {"status": "skipped", "reason": "a stage's push failed", "version": client.version}
            else:
                committed = client.commit(plan["ticket"], tokens, loss)
                outcome = client.await_round(plan["ticket"]) if committed["status"] == "committed" else \
                    {"status": "skipped", "reason": committed["reason"], "version": client.version}
        except (Rejected, Unreachable) as error:
            client.needs_rejoin = isinstance(error, Rejected)
            outcome = {"status": "skipped", "reason": str(error), "version": client.version}
        outcome["finished"] = client.finished
    outcome = _broadcast(outcome, group)
    result = SyncResult(outcome["status"], outcome["version"], outcome.get("round", 0), outcome.get("reason", ""),
                        push_s=time.perf_counter() - started, finished=outcome["finished"])
    if outcome["status"] in ("applied", "rejected"):
        pull_started = time.perf_counter()
        if stage.pull(outcome["version"]):
            result.pull_s = time.perf_counter() - pull_started
            if client is not None:
                client.version = outcome["version"]
                client.report_pull(outcome["version"], result.pull_s, 0)
        else:
            result.status, result.reason = "skipped", "a stage's pull failed"
    return result
