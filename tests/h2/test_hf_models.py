"""Hugging Face models in and out: a Llama-3.2-style (llama3 rope scaling, tied embeddings) and a
Qwen2-style (bias on q/k/v, untied) config.json, written here, give H2 the same parameter count as
`transformers`; a run's export loads with `AutoModelForCausalLM.from_pretrained` and computes H2's
logits (fp32, 1e-5); `--init-from` an exported folder keeps the logits; pickles and fields H2 cannot
honour are refused in one line, exit 2. (The 2-stage TP 2 pipeline's export: tests/heteropp/
test_hf_pipeline_export.py.)"""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
import transformers

from h2.cli.main import main
from h2.core.errors import UserError
from h2.core.model_config import load_model_config
from h2.core.training import TrainConfig
from h2.model.transformer import Transformer
from h2.train.trainer import Trainer
from hf_configs import LLAMA_32_SAVED as LLAMA_32
from hf_configs import QWEN2_SAVED as QWEN2
from hf_configs import transformers_model, write_config

FAMILIES = {"llama-3.2": LLAMA_32, "qwen2": QWEN2}


def hf_logits(folder: str, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(tokens).logits


def h2_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)


def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module", params=list(FAMILIES))
def trained(request, tmp_path_factory):
    """20 steps of the single-device trainer on the family's config, exported with `h2 export`."""
    root = tmp_path_factory.mktemp(request.param)
    config_path = write_config(root / "given", FAMILIES[request.param])
    model_config = load_model_config(config_path)
    config = TrainConfig(steps=20, micro_batch_size=2, micro_batches=2, seq_len=32, checkpoint_every=0)
    trainer = Trainer(model_config, config, str(root / "run"), show_progress=False)
    trainer.run()
    out = str(root / "export")
    assert main(["export", "--run", str(root / "run"), "--format", "hf", "--out", out]) == 0
    return request.param, config_path, trainer, out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_parameter_count_of_a_hugging_face_config_equals_transformers(family, tmp_path):
    path = write_config(tmp_path, FAMILIES[family])
    config = load_model_config(path)
    reference = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path))
    expected = sum(p.numel() for p in reference.parameters())
    assert config.num_parameters() == expected
    assert sum(p.numel() for p in Transformer(config).parameters()) == expected


def test_the_hugging_face_fields_map_to_the_model_config(tmp_path):
    llama = load_model_config(write_config(tmp_path / "Llama-3.2-tiny", LLAMA_32))
    assert (llama.name, llama.family, llama.tie_embeddings, llama.rope_scaling, llama.rope_factor) == \
        ("Llama-3.2-tiny", "llama", True, "llama3", 32.0)
    assert (llama.num_kv_heads, llama.head_dim, llama.norm_eps, llama.rope_theta) == (2, 16, 1e-5, 500000.0)
    qwen = load_model_config(write_config(tmp_path / "q", QWEN2))
    assert (qwen.family, qwen.qkv_bias, qwen.tie_embeddings, qwen.norm_eps) == ("qwen2", True, False, 1e-6)


def test_an_export_after_20_steps_loads_in_transformers_with_h2s_logits(trained):
    _, _, trainer, out = trained
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    model = trainer.model.eval()
    ids = tokens()
    assert torch.allclose(hf_logits(out, ids), h2_logits(model, ids), rtol=0, atol=1e-5)


def test_the_exported_config_is_the_given_models(trained):
    _, config_path, trainer, out = trained
    assert load_model_config(out).architecture() == load_model_config(config_path).architecture()


def test_init_from_an_export_then_no_step_keeps_the_logits(trained, tmp_path):
    _, _, trainer, out = trained
    config = TrainConfig(steps=1, seq_len=32, init_from=out)
    restarted = Trainer(load_model_config(out), config, str(tmp_path / "again"), show_progress=False)
    ids = tokens()
    assert torch.equal(h2_logits(restarted.model, ids), h2_logits(trainer.model, ids))


def test_init_from_a_sharded_folder_written_by_transformers_itself_computes_its_logits(tmp_path):
    folder = str(tmp_path / "hf")
    reference = transformers_model(folder, QWEN2, seed=3, bias_std=1.0)
    reference.save_pretrained(folder, max_shard_size="100KB")
    assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
    config = TrainConfig(steps=1, seq_len=32, init_from=folder)
    trainer = Trainer(load_model_config(folder), config, str(tmp_path / "run"), show_progress=False)
    ids = tokens()
    with torch.no_grad():
        expected = reference(ids).logits
    assert torch.allclose(h2_logits(trainer.model, ids), expected, rtol=0, atol=1e-5)


def test_an_export_above_the_shard_size_is_sharded_with_an_index_and_loads(trained, tmp_path):
    family, _, trainer, _ = trained
    out = str(tmp_path / "sharded")
    assert main(["export", "--run", trainer.out_dir, "--format", "hf", "--out", out, "--max-shard-size", "100KB"]) == 0
    files = sorted(os.listdir(out))
    shards = [name for name in files if name.startswith("model-0")]
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    ids = tokens()
    assert torch.allclose(hf_logits(out, ids), h2_logits(trainer.model, ids), rtol=0, atol=1e-5)


class _Tamper:
    """Unpickling this object would create `marker` (as a malicious checkpoint could run any code)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_folder_with_only_a_pickle_is_refused_in_one_line_and_never_unpickled(cli, tmp_path):
    folder = tmp_path / "pickled"
    write_config(folder, LLAMA_32)
    marker = tmp_path / "unpickled"
    with open(folder / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _Tamper(str(marker))}, handle)
    result = cli("h2", "train", "--init-from", str(folder), "--steps", "1", "--out", str(tmp_path / "run"), "--quiet")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"h2: error: {folder / 'pytorch_model.bin'}: a pickled checkpoint is refused (loading it could run code); "
        "convert it to safetensors"
    ]
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_init_from_a_folder_of_another_model_is_refused_in_one_line(trained, tmp_path):
    family, _, _, out = trained
    other = "qwen2" if family == "llama-3.2" else "llama-3.2"
    given = write_config(tmp_path / "given", FAMILIES[other])
    with pytest.raises(UserError, match=rf"^--init-from {out}: its config.json does not match model 'given' \("):
        Trainer(load_model_config(given), TrainConfig(steps=1, seq_len=32, init_from=out), str(tmp_path / "run"),
                show_progress=False)


REFUSED = [
    ({"sliding_window": 4096, "model_type": "mistral",
      "architectures": ["MistralForCausalLM"]}, "sliding_window", "sliding-window attention is not supported"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window", "sliding-window attention"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling", "rope type 'yarn' is not supported"),
    ({"num_local_experts": 8}, "num_local_experts", "mixture-of-experts models are not supported"),
    ({"num_experts": 4}, "num_experts", "mixture-of-experts"),
    ({"model_type": "gpt2"}, "model_type", "'gpt2' is not a family H2 implements"),
    ({"hidden_act": "gelu"}, "hidden_act", "'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias", "true is not supported"),
    ({"num_key_value_heads": 3}, "num_kv_heads", "must divide num_heads"),
]


@pytest.mark.parametrize("change, field, message", REFUSED, ids=[field for _, field, _ in REFUSED])
def test_a_field_h2_cannot_honour_is_refused_in_one_line_naming_it(cli, tmp_path, change, field, message):
    path = write_config(tmp_path, LLAMA_32 | change)
    result = cli("h2", "model-info", "--model-config", path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"h2: error: {path}: field '{field}'") and message in lines[0]


def test_a_mistral_config_without_a_sliding_window_is_accepted(tmp_path):
    path = write_config(tmp_path, LLAMA_32 | {"model_type": "mistral", "sliding_window": None, "rope_scaling": None})
    config = load_model_config(path)
    reference = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path))
    assert config.family == "mistral" and config.num_parameters() == sum(p.numel() for p in reference.parameters())


def test_h2_plan_takes_a_hugging_face_config_named_by_the_cluster_file_relative_to_it(tmp_path, capsys):
    write_config(tmp_path / "Llama-3.2-tiny", LLAMA_32)
    shipped = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "clusters", "local-emulated.yaml")
    with open(shipped) as handle:
        text = handle.read().replace("\nmodel: tiny\n", "\nmodel: Llama-3.2-tiny/config.json\n")
    (tmp_path / "cluster.yaml").write_text(text)
    os.makedirs(tmp_path / "profiles")
    status = main([
        "plan", "--cluster",
        str(tmp_path / "cluster.yaml"), "--profiles",
        str(tmp_path / "profiles"), "--out",
        str(tmp_path / "plan")
    ])
    out = capsys.readouterr().out
    assert status == 0 and "plan for model Llama-3.2-tiny" in out, out
    with open(tmp_path / "plan" / "plan.json") as handle:
        planned = json.load(handle)["model_config"]
    assert planned == load_model_config(str(tmp_path / "Llama-3.2-tiny")).to_dict()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_h2_model_info_counts_a_hugging_face_configs_parameters_as_transformers(cli, tmp_path, family):
    path = write_config(tmp_path, FAMILIES[family])
    result = cli("h2", "model-info", "--model-config", path, "--json")
    assert result.returncode == 0, result.stderr
    reference = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path))
    assert json.loads(result.stdout)["parameters"] == sum(p.numel() for p in reference.parameters())


def test_an_export_copies_the_tokenizer_the_runs_options_name_and_says_the_byte_tokenizer_has_none(tmp_path):
    from h2.cli.export import _copy_tokenizer
    tokenizer = tmp_path / "tok" / "tokenizer.json"
    tokenizer.parent.mkdir()
    tokenizer.write_text('{"model": {"type": "BPE"}}')
    (tmp_path / "out").mkdir()
    assert _copy_tokenizer({"train_config": {"tokenizer": str(tokenizer)}}, str(tmp_path / "out")) == \
        "tokenizer tokenizer.json"
    assert (tmp_path / "out" / "tokenizer.json").read_text() == tokenizer.read_text()
    assert "byte tokenizer" in _copy_tokenizer({"train_config": {}}, str(tmp_path / "out"))


def test_an_export_into_a_folder_that_is_not_empty_is_refused_in_one_line(trained, cli, tmp_path):
    _, _, trainer, _ = trained
    (tmp_path / "keep.txt").write_text("mine")
    result = cli("h2", "export", "--run", trainer.out_dir, "--format", "hf", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"h2: error: --out {tmp_path}: not empty (give --overwrite to replace its files)"


def test_a_pipeline_init_from_a_folder_of_another_model_is_refused_before_any_rank_starts(trained):
    from h2.core.strategy import strategy_from_mapping
    from h2.core.training import PipelineOptions
    from heteropp.job_checks import check_pipeline_job
    _, _, _, out = trained
    plan = strategy_from_mapping(
        {
            "dp": 1, "micro_batches": 2, "micro_batch_size": 1, "seq_len": 32, "model": "tiny",
            "stages": [{"chip": "a", "tp": 1, "layers": 2}, {"chip": "a", "tp": 1, "layers": 2}]
        }, "s.yaml")
    with pytest.raises(UserError) as error:
        check_pipeline_job(plan, TrainConfig(init_from=out), PipelineOptions(), "s.yaml")
    assert str(error.value).startswith(f"--init-from {out}: its config.json does not match model 'tiny' (num_layers:")
