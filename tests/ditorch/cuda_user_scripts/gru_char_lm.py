"""A character-level GRU language model trained with Adam and truncated backpropagation through time."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from run_report import emit, log_step


class CharGRU(nn.Module):

    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.gru = nn.GRU(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x, h=None):
        out, h = self.gru(self.embed(x), h)
        return self.head(out), h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(42)
    text = "the quick brown fox jumps over the lazy dog. " * 8
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])

    model = CharGRU(len(chars), 32).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, hidden, seq = [], None, 16
    for step in range(args.steps):
        start = (step * seq) % (len(data) - seq - 1)
        chunk = data[start:start + seq + 1].view(1, -1).repeat(4, 1).to(args.device, non_blocking=True)
        logits, hidden = model(chunk[:, :-1], None if hidden is None else hidden.detach())
        loss = F.cross_entropy(logits.reshape(-1, len(chars)), chunk[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        log_step(step, losses[-1])
    emit(model, optimizer, losses)


if __name__ == "__main__":
    main()
