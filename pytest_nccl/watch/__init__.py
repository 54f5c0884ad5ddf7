"""``pytest-nccl watch``: the collective trace and diagnosis of the test modes, live, for a real job.

    pytest-nccl watch --timeout 300 -- torchrun --nproc-per-node 4 train.py --cfg x

The watch starts the launch command with a private directory first on ``PYTHONPATH`` whose
``sitecustomize.py`` runs at start-up in every Python process of the job: once the process has
imported torch it installs the tracer, and once it creates a default process group it is a rank and
starts its journal. A monitor in the watch process reads the journals as they grow and feeds the same
referee as the test modes; on a verdict it prints the same report and ends the job.

Three sides, one folder each (docs/architecture.md): ``inrank/`` runs inside every rank (the start-up
hook, the tracer's installation and the rank's files, the agent); ``engine/`` is the controller, one
per node (follow the files, judge with the one driver, talk to the other nodes' watches, end the
job); ``frontends/`` are what a user starts (the command, the follower of a test's own ranks), each
on the engine's public surface. Both sides read ``jobdir`` (the files of one job), ``timing`` and
``debug`` here.
Nothing here is imported at package import: the rank side must stay cheap (see docs/watch.md).
"""
