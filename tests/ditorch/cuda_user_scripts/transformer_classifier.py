"""A text classifier over nn.TransformerEncoder with dropout, AdamW and a linear warmup schedule."""

import argparse

import torch
import torch.nn as nn

from run_report import emit, log_step


class Classifier(nn.Module):

    def __init__(self, vocab, d_model, classes):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model, padding_idx=0)
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens):
        mask = tokens == 0
        hidden = self.encoder(self.embedding(tokens), src_key_padding_mask=mask)
        return self.head(hidden.masked_fill(mask.unsqueeze(-1), 0).sum(1) / (~mask).sum(1, keepdim=True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 100, (32, 12), generator=generator)
    tokens[:, 9:] = 0  # padding
    labels = (tokens[:, 0] > 50).long()

    model = Classifier(100, 32, 2).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    losses = []
    for step in range(args.steps):
        model.train()
        loss = criterion(model(tokens.to(device)), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        log_step(step, losses[-1])
    emit(model, optimizer, losses)


if __name__ == "__main__":
    main()
