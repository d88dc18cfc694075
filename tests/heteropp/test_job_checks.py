"""The pipeline job's runtime checks, made once by the launcher before any rank starts
(heteropp.job_checks; the engine asserts them): each refusal is one line naming the file and field."""

from __future__ import annotations

import pytest

from h2.core.errors import UserError
from h2.core.strategy import strategy_from_mapping
from h2.core.training import PipelineOptions, TrainConfig
from heteropp.job_checks import check_pipeline_job


def strategy(model="tiny", tp=1, **fields):
    data = {
        "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "model": model,
        "stages": [{"chip": "A", "tp": tp, "layers": 2}, {"chip": "A", "tp": 1, "layers": 2}], **fields
    }
    return strategy_from_mapping(data, "s.yaml")


def check(strategy, config=None, options=None):
    check_pipeline_job(strategy, config or TrainConfig(), options or PipelineOptions(), "s.yaml")


def test_a_runnable_job_passes():
    check(strategy(seq_len=32))


def test_tied_embeddings_across_stages_of_equal_tp_and_dp_pass():
    check(strategy(model={"preset": "tiny", "tie_embeddings": True}))


def test_tied_embeddings_across_stages_of_different_tp_are_refused_in_one_line():
    with pytest.raises(UserError) as error:
        check(strategy(model={"preset": "tiny", "tie_embeddings": True}, tp=2))
    assert str(error.value) == ("s.yaml: model 'tiny' ties its embedding to its head across stages, which needs the "
                                "first and last stages' tp equal (got 2 and 1)")


def test_tied_embeddings_across_stages_with_sharded_optimizer_state_are_refused_in_one_line():
    with pytest.raises(UserError) as error:
        check(strategy(model={"preset": "tiny", "tie_embeddings": True}, optimizer_sharding="zero1"))
    assert str(error.value) == ("s.yaml: model 'tiny' ties its embedding to its head across stages, which needs "
                                "optimizer_sharding none (got zero1)")


def test_a_sequence_longer_than_the_models_is_refused_in_one_line():
    with pytest.raises(UserError) as error:
        check(strategy(seq_len=65))
    assert str(error.value) == "s.yaml: seq_len 65 exceeds the model's max_seq_len 64"


def test_a_sequence_length_from_the_run_is_checked_where_the_strategy_sets_none():
    with pytest.raises(UserError, match="^s.yaml: seq_len 128 exceeds the model's max_seq_len 64$"):
        check(strategy(), TrainConfig(seq_len=128))


def test_a_stage_tp_that_does_not_divide_the_model_is_refused_naming_the_field():
    with pytest.raises(UserError) as error:
        check(strategy(tp=8))
    assert str(error.value) == "s.yaml: field 'stages[0].tp': tp 8 does not divide the model's num_heads (4)"


def test_a_schedule_flag_other_than_gpipe_on_ministages_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^--schedule 1f1b does not apply to a strategy with ministages or offload"):
        check(strategy(ministages=2), options=PipelineOptions(schedule="1f1b"))


def test_h2_train_refuses_tied_embeddings_across_stages_of_different_tp_before_any_rank_starts(cli, tmp_path):
    path = tmp_path / "tied.yaml"
    path.write_text("dp: 1\nmicro_batches: 2\nmicro_batch_size: 1\nseq_len: 32\n"
                    "model: {preset: tiny, tie_embeddings: true}\n"
                    "stages:\n  - {chip: A, tp: 2, layers: 2}\n  - {chip: A, tp: 1, layers: 2}\n")
    result = cli("h2", "train", "--strategy", str(path), "--steps", "1", "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"h2: error: {path}: model 'tiny' ties its embedding to its head across "
                                     "stages, which needs the first and last stages' tp equal (got 2 and 1)")
