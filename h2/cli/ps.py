"""`h2 ps`: the Di-PS processes, each started by one command, and a local launcher for a whole run.

    h2 ps secrets --config configs/dips/local-4.yaml           # the run secret and every participant's key
    h2 ps master --config configs/dips/local-4.yaml --secret-file runs/dips/secrets/run.secret
    h2 ps shard --master HOST:PORT --index 0 --secret-file shard-0.key    # one shard server (ZeroMQ)
    h2 train --preset tiny --ps HOST:PORT --cluster-id c0 --ps-secret-file cluster-c0.key   # one cluster
    h2 ps launch --config configs/dips/local-4.yaml            # all of them on this machine (keys included)
    h2 ps simulate --clusters configs/dips/paper-table1.yaml   # the outer loop at the paper's scale
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass

from h2.core import flags
from h2.core.dips import MAX_SHARDS, MODES, SECRET_ENV, PSOptions, load_dips_config, parse_address
from h2.core.errors import ArgumentParser, UserError
from h2.core.model_config import PRESETS
from h2.core.ranks import free_port
from h2.core.run_lock import empty_held_folder, hold_output_folder
from h2.core.training import MAX_TIMEOUT_S, RunOptions

MAX_ROUNDS = 10_000  # rounds one simulation or fault injection may name (10k simulated rounds: seconds)

SECRETS = "secrets"  # <out>/secrets/: run.secret (the master's) and one key file per shard and cluster


def _master(args: argparse.Namespace) -> int:
    from h2.ps.auth import MASTER, load_credential
    from h2.ps.master import Master

    config = load_dips_config(args.config)
    credential = load_credential(args.secret_file, MASTER)
    port = config.master_port if args.port is None else args.port
    Master(config, args.config, port=port, credential=credential, resume=args.resume).serve_forever()
    return 0


def _shard(args: argparse.Namespace) -> int:
    from h2.ps.auth import load_credential, shard_name
    from h2.ps.shard import ShardServer

    parse_address(args.master, "--master")
    for name in ("control_port", "data_port"):
        if not 0 <= getattr(args, name) <= 65535:
            raise UserError(f"--{name.replace('_', '-')} must be a TCP port, got {getattr(args, name)}")
    if args.index < 0:
        raise UserError(f"--index must be 0 or positive, got {args.index}")
    credential = load_credential(args.secret_file, shard_name(args.index))
    ShardServer(args.master, args.index, args.host, args.control_port, args.data_port, credential=credential,
                crash_at_round=args.crash_at_round).serve_forever()
    return 0


@dataclass
class Kill:
    """Fault injection: SIGKILL a process after `seconds`, or once `rounds` rounds are logged."""
    name: str
    seconds: float | None = None
    rounds: int | None = None

    def due(self, elapsed: float, rounds: int) -> bool:
        return elapsed >= self.seconds if self.seconds is not None else rounds >= self.rounds


def _parse_kill(text: str) -> Kill:
    name, _, at = text.partition("@")
    try:
        if at.startswith("r"):
            return Kill(name, rounds=int(at[1:]))
        seconds = float(at)
        if not 0 <= seconds <= MAX_TIMEOUT_S:
            raise ValueError(seconds)
        return Kill(name, seconds=seconds)
    except ValueError:
        raise UserError(f"--kill {text!r}: expected NAME@SECONDS or NAME@rROUNDS (master, shard-0, cluster-c1)") \
            from None


class RoundCounter:
    """How many rounds the master has logged (read as the log grows)."""

    def __init__(self, path: str):
        self.path, self.offset, self.rounds = path, 0, 0

    def count(self) -> int:
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                handle.seek(self.offset)
                text = handle.read()
            complete = text[:text.rfind("\n") + 1]
            self.offset += len(complete.encode("utf-8"))
            self.rounds += complete.count('"event": "round"')
        return self.rounds


def _secrets(config) -> str:
    """Write the run secret (kept if the run has one) and every participant's key; their folder."""
    from h2.ps.auth import write_run_secrets

    folder = os.path.join(config.out, SECRETS)
    write_run_secrets(folder, config.shards, [spec.id for spec in config.clusters])
    return folder


def _cluster_job(config, spec, out: str, master: str, resume: bool) -> list[str]:
    from h2.ps.auth import cluster_name, participant_file

    folder = os.path.join(out, "clusters", spec.id)
    os.makedirs(folder, exist_ok=True)
    job = os.path.join(folder, "job.yaml")
    ps = PSOptions(ps=master, cluster_id=spec.id, pace_step_s=spec.step_time_s, outlier=spec.outlier,
                   outlier_every=spec.outlier_every, outlier_scale=spec.outlier_scale, ps_secret_file=participant_file(
                       os.path.join(out, SECRETS), cluster_name(spec.id)))
    if spec.strategy:  # a pipeline starts over (it keeps no checkpoint) and pulls the latest version
        from h2.launch.pipeline_job import NOT_WITH_STRATEGY
        flags.write_job(job, RunOptions(strategy=spec.strategy, out=folder), config.train, ps,
                        exclude=NOT_WITH_STRATEGY)
        return ["-m", "h2.cli.main", "train", "--config", job]
    model = {"preset": config.model} if config.model in PRESETS else {"model_config": config.model}
    flags.write_job(job, RunOptions(out=folder, quiet=True, **model), config.train, ps)
    has_checkpoint = os.path.exists(os.path.join(folder, "checkpoints", "latest"))
    return ["-m", "h2.cli.main", "train", "--config", job, "--resume" if resume and has_checkpoint else "--overwrite"]


def _write_secrets(args: argparse.Namespace) -> int:
    folder = _secrets(load_dips_config(args.config))
    print(f"{folder}: run.secret (the master's only) and one key file per shard and cluster (mode 0600); "
          f"hand each process its own file")
    return 0


def _check_data(config) -> None:
    """The clusters' data options (the run file's train section), refused here rather than in each cluster."""
    from h2.core.model_config import resolve_model
    from h2.data import check_data_options
    check_data_options(config.train, resolve_model(config.model))


def _launch(args: argparse.Namespace) -> int:
    from h2.ps.auth import participant_file, shard_name
    from h2.ps.supervisor import Child, Supervisor

    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    if not 0 <= args.time_limit <= MAX_TIMEOUT_S:
        raise UserError(f"--time-limit must be 0 (none) or positive, at most {MAX_TIMEOUT_S:g} s, got "
                        f"{args.time_limit:g}")
    config = load_dips_config(args.config)
    _check_data(config)
    if not config.clusters:
        raise UserError(f"{args.config}: field 'clusters' lists no cluster to launch")
    kills = [_parse_kill(text) for text in args.kill]
    out = config.out
    hold_output_folder(out, flag=f"{args.config}: out")
    state = os.path.join(out, "master", "state.json")
    if os.path.exists(state) and not (args.resume or args.overwrite):
        raise UserError(f"{out} holds an earlier run: pass --resume to continue it or --overwrite to start over")
    if args.resume and not os.path.exists(state):
        raise UserError(f"{state}: no run to resume")
    if args.overwrite:
        empty_held_folder(out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    secrets = _secrets(config)
    started = time.monotonic()  # --time-limit counts from here, the processes' start-up included
    host = config.host
    port = config.master_port or free_port()
    master = f"{host}:{port}"
    say = lambda message: print(f"[launch] {message}", flush=True)  # noqa: E731
    shard_host = _shard_host(config, say)
    supervisor = Supervisor(say, env={"OMP_NUM_THREADS": "1"})
    master_argv = [
        "-m", "h2.cli.main", "ps", "master", "--config", args.config, "--port",
        str(port), "--secret-file",
        os.path.join(secrets, "run.secret")
    ]
    supervisor.start(
        Child("master", master_argv + (["--resume"] if args.resume else []), None,
              restart_argv=lambda: master_argv + ["--resume"], restart_delay_s=1.0))
    for index in range(config.shards):
        shard_argv = [
            "-m", "h2.cli.main", "ps", "shard", "--master", master, "--index",
            str(index), "--host", shard_host, "--secret-file",
            participant_file(secrets, shard_name(index))
        ]
        crash = ["--crash-at-round", str(args.shard_crash_at_round)] if index == 0 and args.shard_crash_at_round else []
        supervisor.start(
            Child(f"shard-{index}", shard_argv + crash, os.path.join(out, "logs", f"shard-{index}.log"),
                  restart_argv=lambda argv=shard_argv: argv, restart_delay_s=1.0))
    rejoin_after_s = (config.missed_beats + 1) * config.heartbeat_s
    clusters = []
    for spec in config.clusters:
        name = f"cluster-{spec.id}"
        clusters.append(name)
        supervisor.start(
            Child(name, _cluster_job(config, spec, out, master, args.resume), os.path.join(out, "logs", f"{name}.log"),
                  restart_argv=lambda spec=spec: _cluster_job(config, spec, out, master, True),
                  restart_delay_s=rejoin_after_s))
    unknown = [kill.name for kill in kills if kill.name not in supervisor.children]
    if unknown:
        supervisor.stop_all()
        raise UserError(f"--kill {unknown[0]}: no such process (have {', '.join(supervisor.children)})")
    say(f"{config.mode} run of {len(clusters)} clusters and {config.shards} shards, master {master}; "
        f"logs in {out}/logs; emulated cluster speeds: " +
        ", ".join(f"{s.id} {s.step_time_s:g} s/step" if s.step_time_s else f"{s.id} unpaced" for s in config.clusters))
    rounds = RoundCounter(os.path.join(out, "rounds.jsonl"))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while supervisor.running(clusters):
            elapsed = time.monotonic() - started
            for kill in [kill for kill in kills if kill.due(elapsed, rounds.count())]:
                supervisor.kill(kill.name)
                kills.remove(kill)
            supervisor.poll()
            if args.time_limit and elapsed > args.time_limit:
                say(f"time limit {args.time_limit:g} s reached: stopping")
                break
            time.sleep(0.2)
    finally:
        supervisor.stop_all()
    failed = {
        name: child.exit_codes[-1] for name, child in supervisor.children.items()
        if name in clusters and child.exit_codes and child.exit_codes[-1] != 0
    }
    _summary(out, config, say)
    if failed:
        say(f"clusters that failed: {failed} (see {out}/logs)")
        return 1
    return 0


def _shard_host(config, say) -> str:
    """Where the shards listen: the run file's site at argmax B_iᵀ p (h2.ps.placement), else `host`."""
    from h2.ps.placement import shard_site

    placed = shard_site(config)
    if placed is None:
        return config.host
    site, scores = placed
    say(f"shards placed at site {config.sites[site].name} ({config.sites[site].host}): argmax of B_i^T p, scores " +
        ", ".join(f"{s.name} {score:g}" for s, score in zip(config.sites, scores)))
    return config.sites[site].host


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _summary(out: str, config, say) -> None:
    rounds_path = os.path.join(out, "rounds.jsonl")
    events = []
    if os.path.exists(rounds_path):
        with open(rounds_path, encoding="utf-8") as handle:
            events = [json.loads(line) for line in handle if line.strip()]
    rounds = [e for e in events if e["event"] == "round"]
    counted = {kind: sum(1 for e in events if e["event"] == kind) for kind in ("skip", "drop", "shard_lost", "start")}
    version = rounds[-1]["version"] if rounds else 0
    say(f"{len(rounds)} rounds, final version {version}; skipped rounds {counted['skip']}, dropped clusters "
        f"{counted['drop']}, lost shards {counted['shard_lost']}, master starts {counted['start']}")
    for spec in config.clusters:
        path = os.path.join(out, "clusters", spec.id, "ps.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                syncs = [json.loads(line) for line in handle if line.strip()]
            scored = [s for s in syncs if s.get("eval_loss") is not None]
            if scored:
                say(f"cluster {spec.id}: {len(syncs)} sync points, last pulled version {scored[-1]['version']} "
                    f"scores held-out loss {scored[-1]['eval_loss']:.4f}")


def _simulate(args: argparse.Namespace) -> int:
    from h2.ps.simulator import load_scenario, measured_update, report, simulate, with_update_rate

    scenario = load_scenario(args.clusters)
    if args.update_from:
        measured = measured_update(args.update_from)
        scenario = with_update_rate(scenario, measured.gbps_per_shard)
        print(f"update rate measured in {measured.source}: median update {measured.median_update_s:.4f} s over "
              f"{measured.rounds} rounds of a {measured.model_bytes:,}-byte model on {measured.shards} shards = "
              f"{measured.gbps_per_shard:.3f} Gbit/s per shard (the scenario's update_gbps replaced)")
    print(report(scenario, simulate(scenario, rounds=args.rounds, mode=args.mode)))
    return 0


def add_commands(sub) -> None:
    ps = sub.add_parser("ps", help="Di-PS: asynchronous multi-cluster training through a parameter server")
    commands = ps.add_subparsers(dest="ps_command", required=True, parser_class=ArgumentParser)

    master = commands.add_parser("master", help="the master (control flow: clusters, rounds, heartbeats, penalty)")
    master.add_argument("--config", required=True, metavar="YAML", help="the Di-PS run file (configs/dips/*.yaml)")
    master.add_argument("--port", type=flags.port_number, help="gRPC port (default: the run file's master_port)")
    master.add_argument("--resume", action="store_true", help="continue from <out>/master/state.json")
    master.add_argument("--secret-file", metavar="FILE",
                        help=f"the run secret (<out>/{SECRETS}/run.secret; default: ${SECRET_ENV})")
    master.set_defaults(handler=_master)

    shard = commands.add_parser("shard", help="one shard server (its layers and their outer optimizer)")
    shard.add_argument("--master", required=True, metavar="HOST:PORT", help="the master's address")
    shard.add_argument("--index", type=flags.bounded_int(0, MAX_SHARDS - 1), required=True,
                       help="which shard of the run this is")
    shard.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    shard.add_argument("--control-port", type=flags.port_number, default=0, help="gRPC port (default: any free port)")
    shard.add_argument("--data-port", type=flags.port_number, default=0, help="ZeroMQ port (default: any free port)")
    shard.add_argument("--crash-at-round", type=flags.bounded_int(0, MAX_ROUNDS), default=0, metavar="N",
                       help="fault injection: exit abruptly while preparing round N (0: never)")
    shard.add_argument(
        "--secret-file", metavar="FILE", help=f"this shard's key (<out>/{SECRETS}/shard-I.key) or the run secret "
        f"(default: ${SECRET_ENV})")
    shard.set_defaults(handler=_shard)

    keys = commands.add_parser("secrets", help="write a run's secret and every participant's key (launch does it)")
    keys.add_argument("--config", required=True, metavar="YAML", help="the Di-PS run file (its out folder)")
    keys.set_defaults(handler=_write_secrets)

    launch = commands.add_parser("launch", help="a whole emulated multi-cluster run on this machine")
    launch.add_argument("--config", required=True, metavar="YAML", help="the Di-PS run file")
    launch.add_argument("--resume", action="store_true", help="continue the run in the file's out folder")
    launch.add_argument("--overwrite", action="store_true", help="start over in an out folder that holds a run")
    launch.add_argument(
        "--kill", action="append", default=[], metavar="NAME@SECONDS",
        help="fault injection: SIGKILL master, shard-I or cluster-ID that many seconds in, or "
        "NAME@rN once N rounds are done (repeatable); it is restarted as a scheduler would")
    launch.add_argument("--shard-crash-at-round", type=flags.bounded_int(0, MAX_ROUNDS), default=0, metavar="N",
                        help="fault injection: shard 0 exits while preparing round N (its first start only)")
    launch.add_argument("--time-limit", type=flags.finite_float, default=0.0, metavar="SECONDS",
                        help="stop the run after this long (0: when every cluster stopped)")
    launch.set_defaults(handler=_launch)

    sim = commands.add_parser("simulate", help="the outer loop at the paper's scale: PS overhead per round")
    sim.add_argument("--clusters", required=True, metavar="YAML", help="clusters, throughputs and links")
    sim.add_argument("--rounds", type=flags.bounded_int(1, MAX_ROUNDS), default=20,
                     help=f"outer rounds to simulate, at most {MAX_ROUNDS} (default 20)")
    sim.add_argument(
        "--update-from", metavar="RUN_DIR", help="take the shards' update rate from a run's "
        "rounds.jsonl (median measured update time) instead of the scenario's update_gbps")
    sim.add_argument(
        "--mode", choices=MODES, default="dips",
        help="how rounds close and who exchanges with whom, as the run file's mode (default dips; "
        "async-diloco: no PS, each round's clusters all-reduce)")
    sim.set_defaults(handler=_simulate)
