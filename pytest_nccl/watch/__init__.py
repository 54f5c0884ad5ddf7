"""``pytest-nccl watch``: the collective trace and diagnosis of the test modes, live, for a real job.

    pytest-nccl watch --timeout 300 -- torchrun --nproc-per-node 4 train.py --cfg x

The watch starts the launch command with a private directory first on ``PYTHONPATH`` whose
``sitecustomize.py`` runs at start-up in every Python process of the job: once the process has
imported torch it installs the tracer, and once it creates a default process group it is a rank and
starts its journal. A monitor in the watch process reads the journals as they grow and feeds the same
referee as the test modes; on a verdict it prints the same report and ends the job.

Modules: ``jobdir`` (the files of one job, both sides), ``inject`` (rank side: what the start-up hook
runs once torch is imported), ``agent`` (rank side: the thread answering the watch), ``monitor``
(journals -> referee -> verdict), ``outcome`` (what a verdict does to the job, the exit status, peers
that never appeared: pure), ``present`` (what is printed and written), ``control`` (the launch
command's processes), ``cli`` (the launcher's attempts, the loop).
Nothing here is imported at package import: the rank side must stay cheap (see docs/watch.md).
"""
