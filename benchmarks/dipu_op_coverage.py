"""Which operators four model families dispatch on dipu, and which of them leave the DIOPI table.

    python benchmarks/dipu_op_coverage.py [--json] [--models llama,convnet,lstm,encoder]

For each model (a LLaMA-style transformer: h2.model; a conv net with batch norm, max pooling and
dropout; an LSTM language model with tied embedding and output weights; an nn.TransformerEncoder
with dropout) it runs one forward + backward, then one AdamW step, on dipu under the op log
(ditorch.op_tools.OpObserve), and reports per phase: the ATen op calls the log saw, how many
distinct operators that was, how many calls ran a DIOPI kernel, and every operator that went through
the CPU fallback with its count (ditorch.dipu.fallback_counts()). --json prints the same as one
JSON object. The sizes are small: the point is which operators run, not their speed.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import ditorch.dipu as dipu
from ditorch.op_tools import OpObserve
from h2.core.model_config import ModelConfig
from h2.model import Transformer
from h2.model.transformer import language_model_loss

VOCAB = 96


class ConvNet(nn.Module):
    """conv-bn-relu-pool twice, dropout, a linear classifier (an MNIST/CIFAR-style network)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(64, 10))

    def forward(self, images):
        return self.classifier(self.features(images))


class LSTMLanguageModel(nn.Module):
    """Embedding, two LSTM layers with dropout between them, an output layer sharing the embedding's weight."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, dropout=0.2)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(width, VOCAB)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(self.drop(self.lstm(self.drop(self.embedding(tokens)))[0]))


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (post-norm layers, ReLU, dropout 0.1) over embeddings, then a linear head."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens):
        return self.head(self.encoder(self.embedding(tokens)))


def llama():
    config = ModelConfig(name="coverage", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, max_seq_len=16)
    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    return Transformer(config), tokens[:, :-1], lambda logits: language_model_loss(logits, tokens[:, 1:].to("dipu"))


def convnet():
    images = torch.randn(4, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([1, 7, 3, 0])
    return ConvNet(), images, lambda logits: F.cross_entropy(logits, labels.to("dipu"))


def lstm():
    tokens = torch.randint(0, VOCAB, (9, 2), generator=torch.Generator().manual_seed(0))
    return (LSTMLanguageModel(), tokens[:-1],
            lambda logits: F.cross_entropy(logits.reshape(-1, VOCAB), tokens[1:].reshape(-1).to("dipu")))


def encoder():
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    return (EncoderClassifier(), tokens[:, :-1],
            lambda logits: F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1).to("dipu")))


MODELS = {"llama": llama, "convnet": convnet, "lstm": lstm, "encoder": encoder}


def observed(run) -> dict:
    """Op log counts, DIOPI kernel calls and CPU fallbacks of run()."""
    dipu.reset_fallback_counts()
    diopi_before = sum(dipu._C._diopi_call_counts().values())
    with OpObserve(keep_records=True, report=None) as log:
        run()
    return {
        "op_calls": log.calls, "distinct_ops": len({record["op"] for record in log.records}),
        "diopi_calls": sum(dipu._C._diopi_call_counts().values()) - diopi_before, "fallbacks": dict(
            sorted(dipu.fallback_counts().items()))
    }


def coverage(name: str) -> dict:
    torch.manual_seed(0)
    model, inputs, loss_of = MODELS[name]()
    model = model.to("dipu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = inputs.to("dipu")
    return {
        "forward_backward": observed(lambda: loss_of(model(inputs)).backward()),
        "optimizer_step": observed(optimizer.step)
    }


def report_lines(results: dict) -> list[str]:
    lines = [
        f"{'model':<9} {'phase':<17} {'op calls':>8} {'ops':>4} {'DIOPI':>6} {'fallback':>8}  operators that fell back"
    ]
    for name, phases in results.items():
        for phase, r in phases.items():
            fell = ", ".join(f"{op} x{count}" for op, count in r["fallbacks"].items()) or "-"
            lines.append(f"{name:<9} {phase:<17} {r['op_calls']:>8} {r['distinct_ops']:>4} {r['diopi_calls']:>6} "
                         f"{sum(r['fallbacks'].values()):>8}  {fell}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    names = [name for name in args.models.split(",") if name]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"--models: unknown model {', '.join(unknown)} (known: {', '.join(MODELS)})")
    results = {name: coverage(name) for name in names}
    if args.json:
        print(json.dumps(results))
    else:
        print(f"dipu vendor {dipu.vendor_name()}, {torch.dipu.get_device_name(0)}; torch {torch.__version__}")
        print("\n".join(report_lines(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
