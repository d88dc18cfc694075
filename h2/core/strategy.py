"""The strategy file: what HeteroAuto writes and HeteroPP reads.

    dp: 4                      # data-parallel replicas of every stage (a stage may set its own)
    micro_batches: 32          # micro-batches per step (b); global batch = dp * b * micro_batch_size
    micro_batch_size: 1        # sequences per micro-batch per replica of a stage with `dp` replicas
    seq_len: 4096              # optional; tokens per sequence
    schedule: 1f1b             # or 1f1b-split-backward (zero-bubble style, alpha = 0), jeeves, or gpipe
    orders: [...]              # optional: each stage's compute actions in order (h2.core.stage_orders)
    in_flight_limit: 4         # optional, jeeves: micro-batches a stage may hold at once (k)
    replica_orders: [[...]]    # optional, jeeves across a shared link: per replica its per-stage orders
    send_lists: ["0F: 0.0 1.0 ..."]  # optional, with them: each shared boundary's global send order
    model: h2-100b             # preset name, or a mapping of ModelConfig fields (with optional `preset`)
    stages:                    # pipeline order
      - {chip: A, tp: 2, layers: 8, recompute: true}          # dp 4 (the strategy's)
      - {chip: A, tp: 4, dp: 2, layers: 6, recompute: false}  # per-stage dp (paper Figure 8)
      - {chip: B, tp: 2, dp: 2, layers: 4, device: dipu}      # HeteroPP: this stage's device type
      - {chip: B, tp: 2, layers: 4, site: south}              # its datacenter (default: the chip type's)
      - {chips: [B, C], rows: [1, 3], layers: 4}              # Zorse: a mixed-type group, uneven rows
      - ...
    ministages: 1              # Zorse: layer chunks per stage, interleaved round-robin (GPipe order)
    optimizer_sharding: zero2  # optional: none | zero1 | zero2 (else the run's --optimizer-sharding)
    offload: [activations, parameters]   # optional: what waits in host memory between its uses
    reshuffle: true            # optional, Zorse: whole micro-batches per replica, each finished one to the
                               # next stage's replica with the most work left (heteropp.reshuffle)

A stage's `chips` lists the chip type of each data-parallel replica (a group mixing chip types; its
dp is the list's length, tp must be 1, and `chip`, if given, must be the first); its `rows` lists the
sequences of each micro-batch that each replica takes (uneven, e.g. in proportion to chip speed;
they sum to dp * micro_batch_size). Without `rows` the replicas split a micro-batch evenly.

Zorse's schedule is GPipe's (`schedule: gpipe`; any strategy with ministages > 1 or offload runs in
GPipe order). With `ministages` m > 1 the layers are cut into stages * m chunks; chunk c goes to stage c % stages
(stage s holds chunks s, s + stages, ...: Megatron's interleaved layout), each stage's `layers` being
the sum of its m chunks, split as evenly as possible (the first layers % m chunks one layer larger;
at least one layer each), as the Zorse planner cuts a group's layers.

Every stage processes the whole global batch each step, as the same `micro_batches` micro-batches of
dp * micro_batch_size sequences; a stage with its own dp d splits each micro-batch over its d
replicas (dp * micro_batch_size / d sequences each), so d must divide dp * micro_batch_size.
HeteroAuto writes one dp for all stages; per-stage dp is for hand-written strategies such as the
paper's Figure 8 (TP 2/4/2, DP 4/2/2).

Rank mapping (HeteroPP): stage 0 gets global ranks [0, tp0*dp0), stage 1 the next tp1*dp1 ranks, and
so on; each stage's chips are tp * dp of its chip type. The layers of all stages sum to the model's.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

import yaml

from h2.core.config_io import dataclass_from_mapping, load_yaml_mapping
from h2.core.errors import UserError
from h2.core.model_config import PRESETS, ModelConfig, resolve_model
from h2.core.schedule import ScheduleName, schedule_named
from h2.core.stage_orders import check_replica_orders, parse_orders


@dataclass(frozen=True)
class StageSpec:
    chip: str
    tp: int
    layers: int
    recompute: bool = False
    dp: int | None = None  # None: the strategy's dp
    device: str | None = None  # HeteroPP: torch device type of this stage; None: the run's --device
    site: str | None = None  # the datacenter this stage runs in; None: its chip type's (h2.core.links)
    chips: list[str] | None = None  # Zorse: the chip type of each replica (a mixed-type group)
    rows: list[int] | None = None  # sequences of a micro-batch each replica takes; None: even split

    def replica_chip(self, dp_index: int) -> str:
        return self.chips[dp_index] if self.chips else self.chip


def even_chunks(layers: int, ministages: int) -> tuple[int, ...]:
    """`layers` cut into `ministages` chunks as evenly as possible, the larger ones first."""
    size, extra = divmod(layers, ministages)
    return tuple(size + (1 if chunk < extra else 0) for chunk in range(ministages))


@dataclass
class Strategy:
    dp: int
    micro_batches: int
    micro_batch_size: int
    stages: list[StageSpec]
    model: str | dict = "tiny"
    schedule: ScheduleName = "1f1b"
    seq_len: int | None = None
    orders: list[str] | None = None  # per stage, the compute actions in the order they run (h2.core.stage_orders)
    # jeeves: micro-batches a stage may hold at once (k); None: what its memory holds
    in_flight_limit: int | None = None
    ministages: int = 1
    optimizer_sharding: Literal["none", "zero1", "zero2"] | None = None
    offload: list[Literal["activations", "parameters"]] = dataclasses.field(default_factory=list)
    # jeeves with replicas sharing a cross-site link (h2.core.stage_orders): replica_orders[d][s] is what
    # stage s of replica d runs (replica 0's are `orders`); send_lists: per shared boundary and direction,
    # the global order its replicas' messages take the link in ("0F: 0.0 1.0 0.1 1.1 ...")
    replica_orders: list[list[str]] | None = None
    send_lists: list[str] | None = None
    # Zorse's dynamic micro-batch reshuffling (heteropp.reshuffle): a replica takes whole micro-batches
    # (its share in proportion to its rows), each stage's i-th finished one going to the next stage's
    # replica with the i-th most work left; GPipe order, tp 1, no ministages, offload or ZeRO-2
    reshuffle: bool = False

    def model_config(self, source: str = "strategy") -> ModelConfig:
        if isinstance(self.model, str):
            return resolve_model(self.model)
        data = dict(self.model)
        base = data.pop("preset", None)
        if base is not None:
            if base not in PRESETS:
                raise UserError(f"{source}: field 'model.preset': unknown preset '{base}'")
            data = {**PRESETS[base].to_dict(), **data}
        return dataclass_from_mapping(ModelConfig, data, f"{source}: field 'model'")

    def stage_dp(self, index: int) -> int:
        """Data-parallel replicas of stage `index`: its chips', its own dp, else the strategy's."""
        stage = self.stages[index]
        if stage.chips:
            return len(stage.chips)
        return self.dp if stage.dp is None else stage.dp

    def stage_rows(self, index: int) -> list[int]:
        """Sequences of each micro-batch that each replica of stage `index` takes."""
        rows = self.stages[index].rows
        if rows:
            return list(rows)
        return [self.micro_batch_sequences // self.stage_dp(index)] * self.stage_dp(index)

    @property
    def micro_batch_sequences(self) -> int:
        """Sequences in one micro-batch, summed over the replicas of any stage."""
        return self.dp * self.micro_batch_size

    def stage_micro_batch_size(self, index: int) -> int:
        """Sequences of one micro-batch that one replica of stage `index` processes (with uneven
        `rows`: the most any replica takes)."""
        return max(self.stage_rows(index))

    def chunk_sizes(self, index: int) -> list[int]:
        """Layers of each ministage (chunk) of stage `index` (even_chunks)."""
        return list(even_chunks(self.stages[index].layers, self.ministages))

    def chunk_layers(self, index: int) -> list[range]:
        """Global layer indices of each ministage (chunk) of stage `index`, in chunk order (module doc:
        chunk c of stage s is the model's chunk c * stages + s)."""
        starts, first = {}, 0
        for chunk in range(self.ministages):
            for stage_index, stage in enumerate(self.stages):
                size = self.chunk_sizes(stage_index)[chunk]
                starts[(stage_index, chunk)] = range(first, first + size)
                first += size
        return [starts[(index, chunk)] for chunk in range(self.ministages)]

    @property
    def world_size(self) -> int:
        return sum(stage.tp * self.stage_dp(index) for index, stage in enumerate(self.stages))

    @property
    def uniform_dp(self) -> bool:
        return all(self.stage_dp(index) == self.dp for index in range(len(self.stages)))

    def chips_per_type(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for index, stage in enumerate(self.stages):
            for replica in range(self.stage_dp(index)):
                chip = stage.replica_chip(replica)
                used[chip] = used.get(chip, 0) + stage.tp
        return used

    def rank_chips(self) -> list[str]:
        """The chip type of each global rank (stage_ranks' layout: replica-major, TP neighbours adjacent)."""
        return [
            stage.replica_chip(replica) for index, stage in enumerate(self.stages)
            for replica in range(self.stage_dp(index)) for _ in range(stage.tp)
        ]

    def stage_ranks(self) -> list[range]:
        """Global ranks of each stage: consecutive blocks of tp * dp, in pipeline order."""
        ranks, start = [], 0
        for index, stage in enumerate(self.stages):
            size = stage.tp * self.stage_dp(index)
            ranks.append(range(start, start + size))
            start += size
        return ranks

    def validate(self, source: str = "strategy") -> None:
        for name, high in (("dp", 1 << 24), ("micro_batches", 1 << 40), ("micro_batch_size", 1 << 24)):
            _check_count(source, name, getattr(self, name), high)
        if self.seq_len is not None:
            _check_count(source, "seq_len", self.seq_len, 1 << 24)
        if not self.stages:
            raise UserError(f"{source}: field 'stages' must list at least one stage")
        for index, stage in enumerate(self.stages):
            if not 0 < stage.tp <= 1 << 10 or stage.tp & (stage.tp - 1):
                raise UserError(
                    f"{source}: field 'stages[{index}].tp' must be a power of two up to 1024, got {stage.tp}")
            if stage.layers <= 0:
                raise UserError(f"{source}: field 'stages[{index}].layers' must be positive, got {stage.layers}")
            if stage.chips is not None:
                self._check_mixed_group(source, index, stage)
            if stage.rows is not None:
                self._check_rows(source, index, stage)
            elif stage.dp is not None:
                _check_count(source, f"stages[{index}].dp", stage.dp, 1 << 24)
                if self.micro_batch_sequences % stage.dp:
                    raise UserError(f"{source}: field 'stages[{index}].dp': {stage.dp} replicas cannot split a "
                                    f"micro-batch of dp * micro_batch_size = {self.micro_batch_sequences} sequences")
        schedule_named(self.schedule, f"{source}: field 'schedule'")
        if self.in_flight_limit is not None and self.in_flight_limit < 1:
            raise UserError(f"{source}: field 'in_flight_limit' must be at least 1 (one micro-batch), "
                            f"got {self.in_flight_limit}")
        if self.orders is not None:
            parse_orders(self.orders, len(self.stages), self.micro_batches, source)
        check_replica_orders(self, source)
        model = self.model_config(source)
        total = sum(stage.layers for stage in self.stages)
        if total != model.num_layers:
            raise UserError(
                f"{source}: field 'stages': layers sum to {total}, model '{model.name}' has {model.num_layers}")
        _check_count(source, "ministages", self.ministages, 1 << 10)
        for index, stage in enumerate(self.stages):
            if stage.layers < self.ministages:
                raise UserError(f"{source}: field 'stages[{index}].layers': {stage.layers} layers cannot be cut "
                                f"into ministages = {self.ministages} chunks of at least one layer")
        if len(set(self.offload)) != len(self.offload):
            raise UserError(f"{source}: field 'offload' lists an entry twice: {self.offload}")

    def _check_mixed_group(self, source: str, index: int, stage: StageSpec) -> None:
        where = f"{source}: field 'stages[{index}].chips'"
        if not stage.chips or not all(stage.chips):
            raise UserError(f"{where} must list the chip type of each replica, got {stage.chips}")
        if stage.tp != 1:
            raise UserError(
                f"{source}: field 'stages[{index}].tp': a mixed-type group (chips) runs tp 1, got {stage.tp}")
        if stage.dp is not None and stage.dp != len(stage.chips):
            raise UserError(f"{source}: field 'stages[{index}].dp' ({stage.dp}) differs from the {len(stage.chips)} "
                            f"replicas its 'chips' lists")
        if stage.chip != stage.chips[0]:
            raise UserError(f"{source}: field 'stages[{index}].chip' ({stage.chip}) must be the first of its "
                            f"'chips' ({stage.chips[0]}), or left out")

    def _check_rows(self, source: str, index: int, stage: StageSpec) -> None:
        where = f"{source}: field 'stages[{index}].rows'"
        replicas = self.stage_dp(index)
        if len(stage.rows) != replicas:
            raise UserError(f"{where} lists {len(stage.rows)} replicas, the stage has {replicas}")
        if any(rows <= 0 for rows in stage.rows):
            raise UserError(f"{where} must be positive for every replica, got {stage.rows}")
        if sum(stage.rows) != self.micro_batch_sequences:
            raise UserError(f"{where} sum to {sum(stage.rows)}, a micro-batch has dp * micro_batch_size = "
                            f"{self.micro_batch_sequences} sequences")

    def to_dict(self) -> dict:
        data = {"dp": self.dp, "micro_batches": self.micro_batches, "micro_batch_size": self.micro_batch_size}
        if self.seq_len is not None:
            data["seq_len"] = self.seq_len
        data["schedule"] = self.schedule
        if self.ministages != 1:
            data["ministages"] = self.ministages
        if self.optimizer_sharding is not None:
            data["optimizer_sharding"] = self.optimizer_sharding
        if self.offload:
            data["offload"] = list(self.offload)
        data["model"] = self.model
        data["stages"] = [{
            key: value for key, value in dataclasses.asdict(stage).items()
            if not (key in ("dp", "device", "site", "chips", "rows") and value is None)
        } for stage in self.stages]
        if self.in_flight_limit is not None:
            data["in_flight_limit"] = self.in_flight_limit
        if self.orders is not None:
            data["orders"] = list(self.orders)
        if self.replica_orders is not None:
            data["replica_orders"] = [list(orders) for orders in self.replica_orders]
        if self.send_lists is not None:
            data["send_lists"] = list(self.send_lists)
        if self.reshuffle:
            data["reshuffle"] = True
        return data

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle, sort_keys=False, default_flow_style=None)


def strategy_from_mapping(data: dict, source: str) -> Strategy:
    data = dict(data)
    model = data.pop("model", "tiny")
    if not isinstance(model, (str, dict)):
        raise UserError(f"{source}: field 'model': expected a preset name, a path or a mapping, got {model!r}")
    stages = data.get("stages")
    if isinstance(stages, list):  # a mixed-type group may leave out `chip`: its first replica's
        data["stages"] = [{"chip": stage["chips"][0], **stage} if isinstance(stage, dict) and "chip" not in stage
                          and isinstance(stage.get("chips"), list) and stage["chips"] else stage for stage in stages]
    strategy = dataclass_from_mapping(Strategy, data, source)
    strategy.model = model
    strategy.validate(source)
    return strategy


def load_strategy(path: str | os.PathLike) -> Strategy:
    path = os.fspath(path)
    return strategy_from_mapping(load_yaml_mapping(path), path)


def _check_count(source: str, name: str, value: int, high: int) -> None:
    if value <= 0:
        raise UserError(f"{source}: field '{name}' must be positive, got {value}")
    if value > high:
        raise UserError(f"{source}: field '{name}' must be at most {high}, got {value}")
