"""Launching a pipeline job: the layer between the trainers and the commands.

Owns: starting one local torchrun, or one per emulated node in its own network namespace (`launcher`,
`netns`), torchrun's agent that records which ranks failed and how (`agent`, run as
`python -m h2.launch.agent`), checking a job against its cluster and opening a rank's chip (`cluster_job`),
profiling a cluster's chip types by running measuring ranks, or from the profile cache (`profiling_job`),
and the contract between the launcher and its ranks (`contract`: the marks a rank leaves in the job
folder, the environment the launcher sets, how ranks are named).

May import every layer below (h2.core, h2.model, h2.data, ditorch, dicomm, heteropp, heteroauto, h2.ps,
h2.train); never h2.cli.
"""
