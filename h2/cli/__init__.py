"""The top layer: every command line of the product.

main (`h2`), heteroauto (`heteroauto`), ditorch (`ditorch`), rank (`python -m h2.cli.rank`, one rank
of a pipeline job under torchrun); launch (how `h2 train --strategy` starts those ranks), agent
(torchrun's agent, recording the ranks' exit statuses for launch) and netns (a
cluster's nodes as network namespaces of this machine, for launch). Commands parse flags (generated from h2.core's configs where a
config exists), call the layers below, and report user errors in one line with exit status 2
(h2.core.errors.run_cli). Nothing imports h2.cli.
"""
