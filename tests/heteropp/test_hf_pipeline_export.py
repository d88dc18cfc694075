"""A Hugging Face model trained as a 2-stage TP 2 pipeline: both the pipeline and the single-device trainer
start `--init-from` the same folder written by `transformers` itself, train 20 steps on the same data
(fp32), and `h2 export` of each loads with `AutoModelForCausalLM.from_pretrained`, computes the logits
of H2's own forward (1e-5), and equals the other export (1e-5)."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from safetensors.torch import load_file

from h2.cli.main import main
from h2.core.model_config import load_model_config
from h2.core.strategy import strategy_from_mapping
from h2.model.hf_weights import copy_into
from h2.model.transformer import Transformer
from h2.train import TrainConfig, Trainer
from h2.train.checkpoint import CheckpointDir
from heteropp_launch import max_relative_loss_difference, run_pipeline
from hf_configs import LLAMA_32, QWEN2, transformers_model

pytestmark = pytest.mark.slow

STEPS = 20


def hf_folder(folder: str, data: dict) -> str:
    """A model folder saved by transformers from its own random initialisation (biases made non-zero)."""
    transformers_model(folder, data, seed=11, bias_std=0.02).save_pretrained(folder)
    return folder


def strategy(config_path: str) -> dict:
    return {
        "dp": 1, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 32, "model": config_path,
        "stages": [{"chip": "a", "tp": 2, "layers": 1}, {"chip": "a", "tp": 2, "layers": 1}]
    }


def single_device(data: dict, init_from: str, out: str) -> list[dict]:
    """The single-device trainer on the pipeline's global batches (heteropp_launch.run_reference's setup)."""
    plan = strategy_from_mapping(data, "test strategy")
    config = TrainConfig(steps=STEPS, micro_batch_size=plan.micro_batch_size, micro_batches=plan.micro_batches,
                         seq_len=plan.seq_len, init_from=init_from, checkpoint_every=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return Trainer(plan.model_config(), config, out, show_progress=False).run()
    finally:
        torch.set_num_threads(threads)


def h2_model_of(run: str, config) -> Transformer:
    """H2's model with the run's newest checkpoint's weights (TP pieces and stages put together)."""
    checkpoint = CheckpointDir(run).load_latest()
    model = Transformer(config)
    copy_into(model, {name: checkpoint.parameter(name) for name, _ in model.named_parameters()})
    return model


def export(run: str, out: str) -> str:
    assert main(["export", "--run", run, "--format", "hf", "--out", out]) == 0
    return out


@pytest.mark.parametrize("family, data", [("llama-3.2", LLAMA_32), ("qwen2", QWEN2)])
def test_a_2_stage_tp_2_pipeline_and_the_single_device_trainer_export_the_same_hugging_face_model(
        tmp_path, family, data):
    start = hf_folder(str(tmp_path / "start"), data)
    plan = strategy(os.path.join(start, "config.json"))
    records, _ = run_pipeline(plan, STEPS, out_dir=str(tmp_path / "pipeline"),
                              train={"init_from": start, "checkpoint_every": 0})
    reference = single_device(plan, start, str(tmp_path / "single"))
    assert max_relative_loss_difference(records, reference) < 1e-5

    exports = [export(str(tmp_path / run), str(tmp_path / f"{run}-hf")) for run in ("pipeline", "single")]
    pipeline_tensors, single_tensors = (load_file(os.path.join(out, "model.safetensors")) for out in exports)
    assert pipeline_tensors.keys() == single_tensors.keys()
    assert all(
        torch.allclose(pipeline_tensors[name], single_tensors[name], rtol=0, atol=1e-5) for name in single_tensors)

    tokens = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(5))
    config = load_model_config(os.path.join(start, "config.json"))
    for run, out in zip(("pipeline", "single"), exports):
        ours = h2_model_of(str(tmp_path / run), config)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        with torch.no_grad():
            assert torch.allclose(theirs(tokens).logits, ours(tokens), rtol=0, atol=1e-5)
