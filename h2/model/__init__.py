"""The H2 model: a LLaMA-style decoder (`Transformer`), free of parallelism (HeteroPP applies stages,
tensor parallelism and recompute from outside).

Its configuration and exact accounting live in h2.core.model_config (pure Python, so the planner
uses them without torch) and are re-exported here; the torch modules are imported on first use of
`Transformer` and friends. Imports only h2.core beside torch.
"""

from h2.core.model_config import PRESETS, ModelConfig, load_model_config, preset, resolve_model

__all__ = [
    "PRESETS", "ModelConfig", "load_model_config", "preset", "resolve_model", "Transformer", "DecoderLayer", "RMSNorm"
]


def __getattr__(name):
    if name in ("Transformer", "DecoderLayer", "RMSNorm"):
        from h2.model import transformer
        return getattr(transformer, name)
    raise AttributeError(f"module 'h2.model' has no attribute {name!r}")
