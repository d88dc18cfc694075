"""Training loop shared by the acceptance tests: the project's model (h2.model.Transformer with a small
ModelConfig) trained with AdamW, checkpointed half way through and restored into a fresh model and
optimizer."""
import io

import torch

from h2.core.model_config import ModelConfig
from h2.model import Transformer
from h2.model.transformer import language_model_loss

# Two layers of grouped-query attention (4 query heads over 2 key/value heads), small enough to train in a test.
CONFIG = ModelConfig(name="dipu-test", vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     intermediate_size=128, max_seq_len=32)


def batches(steps: int, config: ModelConfig, batch: int = 2, seq: int = 16):
    """The same random batch every step: the model can memorise it, so the loss must fall."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=generator)
    for _ in range(steps):
        yield tokens[:, :-1], tokens[:, 1:]


def build(device: str, config: ModelConfig):
    torch.manual_seed(0)
    model = Transformer(config).to(device)
    # At 3e-3 the loss falls at every step; at 1e-2 this model overshoots, and rounding differences
    # (the lowprec profile) would grow past "slightly".
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, optimizer


def train_with_checkpoint(device: str, steps: int = 6, config: ModelConfig = CONFIG) -> list[float]:
    """Loss per step; after steps // 2 the state is saved with torch.save and loaded into new objects."""
    model, optimizer = build(device, config)
    losses = []
    for step, (tokens, targets) in enumerate(batches(steps, config)):
        if step == steps // 2:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
            buffer.seek(0)
            state = torch.load(buffer)
            model, optimizer = build(device, config)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        loss = language_model_loss(model(tokens.to(device)), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
