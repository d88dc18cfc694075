"""The H2 model: a LLaMA-style decoder (`Transformer`) and its configuration and accounting.

`h2.model.config` is pure Python so the planner can use it without torch; the torch modules are
imported on first use of `Transformer` and friends.
"""

from h2.model.config import PRESETS, ModelConfig, load_model_config, preset, resolve_model

__all__ = ["PRESETS", "ModelConfig", "load_model_config", "preset", "resolve_model",
           "Transformer", "DecoderLayer", "RMSNorm"]


def __getattr__(name):
    if name in ("Transformer", "DecoderLayer", "RMSNorm"):
        from h2.model import transformer
        return getattr(transformer, name)
    raise AttributeError(f"module 'h2.model' has no attribute {name!r}")
