"""H2: training one LLM across a cluster of accelerators from several vendors.

This package holds the bottom and the top layers of the project (docs/architecture.md):
`h2.core` (shared by everything: errors and the CLI runner, config loading, model accounting, the
cluster, strategy and job formats, the schedule IR, device and backend lookup), `h2.model` and
`h2.data` (above ditorch and dicomm), and the product on top: `h2.train` (trainers) and `h2.cli`
(every command). Importing `h2` itself loads nothing.
"""

__version__ = "0.1.0"
