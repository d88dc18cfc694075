"""`h2 generate`: text from a run's newest checkpoint, greedy as a hand-rolled argmax loop on the trained
model, sampled reproducibly from its seed; bad input is one line."""

from __future__ import annotations

import pytest
import torch

from h2.cli.main import main
from h2.core.model_config import preset
from h2.data import ByteTokenizer
from h2.train import TrainConfig, Trainer
from h2.train.generation import load_run_model, run_tokenizer

PROMPT = "def "


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("run")
    trainer = Trainer(preset("tiny"), TrainConfig(steps=3, micro_batch_size=4), str(out), corpus=corpus,
                      show_progress=False)
    trainer.run()
    return str(out), trainer.model


def generate(capsys, run: str, *args: str) -> str:
    assert main(["generate", "--run", run, "--prompt", PROMPT, *args]) == 0
    return capsys.readouterr().out


def test_greedy_text_is_the_argmax_of_the_trained_model_token_by_token(trained, capsys):
    run, model = trained
    tokens = [int(token) for token in ByteTokenizer().encode(PROMPT)]
    with torch.no_grad():
        for _ in range(12):
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    assert generate(capsys, run, "--max-new-tokens", "12") == ByteTokenizer().decode(tokens) + "\n"


def test_sampling_is_reproducible_from_its_seed(trained, capsys):
    run, _ = trained
    sampled = ["--max-new-tokens", "24", "--temperature", "1.0", "--top-k", "50"]
    first = generate(capsys, run, *sampled, "--seed", "7")
    assert generate(capsys, run, *sampled, "--seed", "7") == first
    assert generate(capsys, run, *sampled, "--seed", "8") != first
    assert first.startswith(PROMPT) and first != generate(capsys, run, "--max-new-tokens", "24")


def test_top_1_sampling_is_greedy(trained, capsys):
    run, _ = trained
    greedy = generate(capsys, run, "--max-new-tokens", "8")
    assert generate(capsys, run, "--max-new-tokens", "8", "--temperature", "2.0", "--top-k", "1") == greedy


@pytest.mark.parametrize("args, message", [
    (["--prompt", "x"], "--run {missing}: no such run folder"),
    (["--prompt", ""], "--prompt is empty (give at least one character)"),
    (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be between 1 and 100000, got 0"),
    (["--prompt", "x" * 65], "--prompt is 65 tokens, longer than the model's context of 64"),
    (["--prompt", "x", "--temperature", "-1"], "--temperature must be 0 (greedy) or positive, got -1.0"),
    (["--prompt", "x", "--top-k", "257"], "--top-k must be between 1 and the vocabulary size 256, got 257"),
])
def test_bad_input_is_one_line(trained, tmp_path, capsys, args, message):
    run = str(tmp_path / "missing") if "{missing}" in message else trained[0]
    assert main(["generate", "--run", run, *args]) == 2
    assert capsys.readouterr().err == f"h2: error: {message.format(missing=run)}\n"


def test_a_run_folder_without_a_checkpoint_is_one_line(tmp_path, capsys):
    assert main(["generate", "--run", str(tmp_path), "--prompt", "x"]) == 2
    assert capsys.readouterr().err == (f"h2: error: --run {tmp_path}: no checkpoint "
                                       f"(train it first, h2 train --out {tmp_path})\n")


def test_the_checkpoint_loads_as_the_trained_model(trained):
    run, model = trained
    loaded, manifest = load_run_model(run)
    tokens = torch.tensor([[int(token) for token in ByteTokenizer().encode("import os\nimport sys\n")]])
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    assert manifest["step"] == 3


def test_the_tokenizer_the_run_names_encodes_and_decodes_the_prompt(tmp_path):
    import tokenizers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator(["the cat sat on the mat"] * 50, tokenizers.trainers.BpeTrainer(vocab_size=300))
    path = str(tmp_path / "tokenizer.json")
    bpe.save(path)
    tokenizer = run_tokenizer({"train_config": {"tokenizer": path}})
    assert tokenizer.encode("the cat") == bpe.encode("the cat").ids
    assert tokenizer.decode(tokenizer.encode("the cat sat")) == bpe.decode(bpe.encode("the cat sat").ids)
    assert isinstance(run_tokenizer({"train_config": {}}), ByteTokenizer)
