"""A word-level LSTM language model with tied input/output embeddings, as in the PyTorch word_language_model example."""

import argparse

import torch
import torch.nn as nn

from run_report import emit, log_step


class RNNModel(nn.Module):

    def __init__(self, ntoken, ninp, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, ninp, nlayers, dropout=dropout)
        self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight  # tie weights
        self.nlayers, self.nhid = nlayers, ninp

    def forward(self, tokens, hidden):
        emb = self.drop(self.encoder(tokens))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--bptt", type=int, default=8)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(1111)

    ntokens, batch_size = 50, 4
    corpus = torch.randint(0, ntokens, (args.bptt * 4 + 1, batch_size), generator=torch.Generator().manual_seed(0))
    corpus[1::2] = (corpus[0:-1:2] + 1) % ntokens  # learnable: every second word follows the one before
    train_data = corpus.to(device)

    model = RNNModel(ntokens, 32, 2, dropout=0.0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0)
    criterion = nn.NLLLoss()
    losses = []
    model.train()
    hidden = model.init_hidden(batch_size)
    for step in range(args.steps):
        start = (step * args.bptt) % (train_data.size(0) - 1 - args.bptt)
        data, targets = train_data[start:start + args.bptt], train_data[start + 1:start + 1 + args.bptt].reshape(-1)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, dim=-1).view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        losses.append(loss.item())
        log_step(step, losses[-1])
    emit(model, optimizer, losses, ties=[(model.decoder.weight, model.encoder.weight)])


if __name__ == "__main__":
    main()
