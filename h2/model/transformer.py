"""A LLaMA-style decoder: token embedding, decoder layers, final RMSNorm and output head.

Built as separate pieces (`embed`, `layers`, `norm`, `head`) so a pipeline stage can own any
contiguous range of layers, the first stage the embedding and the last the norm and head.
Nothing here knows about parallelism.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from h2.core.model_config import ModelConfig


class RMSNorm(nn.Module):

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_frequencies(config: ModelConfig) -> torch.Tensor:
    """The rotation frequency of each pair of a head's dimensions [head_dim / 2], in fp32; with
    `rope_scaling: llama3`, Llama 3.1's: long wavelengths divided by `rope_factor`, short ones kept,
    those between interpolated."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta**(torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    if config.rope_scaling != "llama3":
        return inv_freq
    factor, low, high = config.rope_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
    original = config.rope_original_max_position
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    between = ~(wavelength < original / high) * ~(wavelength > original / low)
    return torch.where(between, smoothed, scaled)


def rotary_cos_sin(seq_len: int, inv_freq: torch.Tensor, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for rotary position embedding, each [seq_len, head_dim / 2]."""
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x [batch, heads, seq, head_dim] by the position's angle.
    (Hugging Face's Llama pairs x[i] with x[i + head_dim/2]: h2.model.hf_weights permutes q and k.)"""
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    rotated_even = x_even * cos - x_odd * sin
    rotated_odd = x_even * sin + x_odd * cos
    return torch.stack((rotated_even, rotated_odd), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Causal grouped-query attention: num_heads query heads share num_kv_heads key/value heads."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.inv_freq = rotary_frequencies(config).tolist()  # plain numbers: no buffer to move or cut
        self.q_proj = nn.Linear(config.hidden_size, config.q_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.q_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # The local head counts follow the projection widths, so a tensor-parallel shard of
        # this module (narrower projections) runs the same code on its own heads.
        q = self.q_proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)  # [b, heads, s, d]
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)  # [b, kv_heads, s, d]
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        cos, sin = rotary_cos_sin(seq, torch.tensor(self.inv_freq, dtype=torch.float32), x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        queries_per_kv = q.shape[1] // k.shape[1]
        if queries_per_kv > 1:
            k = k.repeat_interleave(queries_per_kv, dim=1)
            v = v.repeat_interleave(queries_per_kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, s, d]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)). Maps [b, s, h] to [b, s, h]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; residual output projections scaled by 1/sqrt(2 * layers); zero biases."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.num_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith(".bias"):
                nn.init.zeros_(param)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(param, mean=0.0, std=residual_std)
            else:
                nn.init.normal_(param, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] (int64) -> logits [b, s, vocab]."""
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits [b, s, vocab], targets [b, s]."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
