"""H2, the product: the model, data, single-device reference trainer, launcher and `h2` CLI.

Owns: `h2.model` (a LLaMA-style decoder and its exact parameter/FLOP/activation accounting),
`h2.data` (byte-level tokenizer and an offline corpus), `h2.train` (trainer, checkpoints,
metrics), `h2.cli`. The model stays free of parallelism: HeteroPP applies stages, tensor
parallelism and recompute to a built model from the outside.
"""

__version__ = "0.1.0"
