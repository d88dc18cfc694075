"""Launching a pipeline job: the layer between the trainers and the commands.

Owns: the pipeline job from the user's options to its running ranks (`pipeline_job`: checked once,
resolved once, written as one file, launched), that file's format (`job`: the resolved job, read by
each rank), checking a job against its cluster (`cluster_job`), starting one local torchrun, or one per
emulated node in its own network namespace (`launcher`, `netns`), the watch that ends a finished job
whose ranks stop making progress while exiting (`exit_watch`), torchrun's agent that records which
ranks failed and how (`agent`, run as `python -m h2.launch.agent`), profiling a cluster's chip types by
running measuring ranks, or from the profile cache (`profiling_job`), and the contract between the
launcher and its ranks (`contract`: the job file, the marks a rank leaves in the job folder, the
environment the launcher sets, how ranks are named).

May import every layer below (h2.core, h2.model, h2.data, ditorch, dicomm, heteropp, heteroauto, h2.ps,
h2.train); never h2.cli. What a rank imports of it (`contract`, `job`) never reaches heteroauto.
"""
