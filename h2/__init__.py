"""H2: training one LLM across a cluster of accelerators from several vendors.

This package holds the bottom layer, the middle of the product and its top (docs/architecture.md):
`h2.core` (layer 0, shared by everything: errors and the CLI runner, config loading, model accounting,
the cluster, strategy and job formats, the schedule registry, device and backend lookup), `h2.model`
and `h2.data` (layer 2, above ditorch and dicomm), `h2.ps` (layer 3, Di-PS, beside heteropp and
heteroauto), `h2.train` (layer 4, the trainers), `h2.launch` (layer 5, a pipeline job checked,
resolved and launched once) and `h2.cli` (layer 6, every command). Importing `h2` itself loads nothing.
"""

__version__ = "0.1.0"
