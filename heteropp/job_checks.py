"""The checks of a pipeline job that only the runtime knows how to make, made once by the launcher
before any rank starts (h2.launch.pipeline_job); the engine (heteropp.engine) then asserts them as
invariants.

Each refusal is a one-line UserError naming the strategy file and field (or the flag).
"""

from __future__ import annotations

from h2.core.errors import UserError
from h2.core.schedule import resolve_schedule
from h2.core.training import PipelineOptions, TrainConfig
from h2.model.hf_weights import check_init_from
from heteropp.engine import train_config_for
from heteropp.reshuffle import check_reshuffle
from heteropp.tensor_parallel import check_tp_divides
from heteropp.tied_embeddings import check_tied_across_stages


def check_pipeline_job(strategy, config: TrainConfig, options: PipelineOptions, source: str = "strategy") -> None:
    """Refuse what HeteroPP cannot run: a schedule the strategy cannot run in (--schedule other than
    GPipe's on ministages or offload), embeddings tied across stages that cannot stay tied
    (heteropp.tied_embeddings), a sequence longer than the model's, a stage's TP size that does not
    divide the model's heads, KV heads, FFN or vocabulary, an --init-from folder whose model is not
    the strategy's, or `reshuffle` where this runtime does not reshuffle (heteropp.reshuffle)."""
    schedule = resolve_schedule(strategy, options.schedule, source)
    check_reshuffle(strategy, strategy.optimizer_sharding or options.optimizer_sharding, schedule.name, source)
    model = strategy.model_config(source)
    check_tied_across_stages(strategy, strategy.optimizer_sharding or options.optimizer_sharding, source)
    seq_len = train_config_for(strategy, config).seq_len
    if seq_len > model.max_seq_len:
        raise UserError(f"{source}: seq_len {seq_len} exceeds the model's max_seq_len {model.max_seq_len}")
    for index, stage in enumerate(strategy.stages):
        check_tp_divides(model, stage.tp, f"{source}: field 'stages[{index}].tp'")
    if config.init_from:
        check_init_from(model, config.init_from)
