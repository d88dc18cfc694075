"""The top layer: every command line of the product.

main (`h2`: `h2 train`, `h2 model-info`, and the subcommands ps and run add to its parser), ps (`h2
ps`), run (`h2 run` and its steps), heteroauto (`heteroauto`), ditorch (`ditorch`), rank (`python -m
h2.cli.rank --job FILE`, one rank of a pipeline job under torchrun, on the job the launcher resolved).
Commands parse flags (generated from h2.core's configs where a config exists), call the layers below
(h2.launch starts a pipeline job's ranks), and report user errors in one line with exit status 2
(h2.core.errors.run_cli). main imports ps and run only to add their subcommands; neither imports main.
Nothing imports h2.cli.
"""
