"""A Di-PS run whose `model:` is a Hugging Face config.json (Qwen2-style: bias on q/k/v): the master,
the shards and a cluster build that model, and one cluster with H=1 and outer SGD of lr 1 trains
exactly like the single-device trainer; a config field H2 cannot honour is refused in one line."""

import json

import pytest

from h2.core.dips import DipsConfig, OuterOptions, PSOptions, check_dips_config
from h2.core.errors import UserError
from h2.core.model_config import load_model_config
from h2.core.training import TrainConfig
from h2.train.ps_sync import run_with_ps
from h2.train.trainer import Trainer
from ps_harness import running_ps

QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 256, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 32, "tie_word_embeddings": False, "use_sliding_window": False
}


def config_file(tmp_path, data) -> str:
    path = tmp_path / "qwen2-small" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(data))
    return str(path)


def test_a_cluster_on_a_hugging_face_model_with_h1_and_outer_sgd_lr1_trains_like_the_single_device_trainer(tmp_path):
    path = config_file(tmp_path, QWEN2)
    config = TrainConfig(steps=3, checkpoint_every=0, micro_batch_size=4)
    reference = Trainer(load_model_config(path), config, str(tmp_path / "reference"), show_progress=False).run()
    with running_ps(tmp_path / "ps", clusters=("solo", ), model=path, mode="sync", inner_steps=1, eval_sequences=0,
                    outer=OuterOptions(optimizer="sgd", lr=1.0, momentum=0.0)) as (_, _, address):
        trainer = Trainer(load_model_config(path), config, str(tmp_path / "cluster"), show_progress=False)
        records = run_with_ps(trainer, PSOptions(ps=address, cluster_id="solo"), show_progress=False,
                              log=lambda _: None)
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in reference], abs=1e-5)


def test_a_run_file_whose_hugging_face_model_has_a_sliding_window_is_refused_in_one_line(tmp_path):
    path = config_file(tmp_path, QWEN2 | {"use_sliding_window": True})
    with pytest.raises(UserError) as error:
        check_dips_config(DipsConfig(model=path), "run.yaml")
    assert str(error.value) == (f"run.yaml: field 'model': {path}: field 'use_sliding_window': sliding-window "
                                "attention is not supported")
