"""Training loop shared by the acceptance tests: a TinyLlama trained with AdamW, checkpointed half
way through and restored into a fresh model and optimizer."""
import io

import torch

from tiny_llama import TinyLlama, TinyLlamaConfig


def batches(steps: int, cfg: TinyLlamaConfig, batch: int = 2, seq: int = 16):
    """The same random batch every step: the model can memorise it, so the loss must fall."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=generator)
    for _ in range(steps):
        yield tokens[:, :-1], tokens[:, 1:]


def build(device: str, cfg: TinyLlamaConfig):
    torch.manual_seed(0)
    model = TinyLlama(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optimizer


def train_with_checkpoint(device: str, steps: int = 6, cfg: TinyLlamaConfig = TinyLlamaConfig()) -> list[float]:
    """Loss per step; after steps // 2 the state is saved with torch.save and loaded into new objects."""
    model, optimizer = build(device, cfg)
    losses = []
    for step, (tokens, targets) in enumerate(batches(steps, cfg)):
        if step == steps // 2:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
            buffer.seek(0)
            state = torch.load(buffer)
            model, optimizer = build(device, cfg)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        loss = model(tokens.to(device), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
