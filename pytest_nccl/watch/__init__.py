"""``pytest-nccl watch``: the collective trace and diagnosis of the test modes, live, for a real job.

    pytest-nccl watch --timeout 300 -- torchrun --nproc-per-node 4 train.py --cfg x

The watch starts the launch command with a private directory first on ``PYTHONPATH`` whose
``sitecustomize.py`` runs at start-up in every Python process of the job: in the ranks (RANK set) it
installs the tracer once torch is imported and starts each rank's journal once the default process
group exists. A monitor in the watch process reads the journals as they grow and feeds the same
referee as the test modes; on a verdict it prints the same report and ends the job.

Modules: ``jobdir`` (the files of one job, both sides), ``inject`` (rank side: the start-up hook),
``agent`` (rank side: the thread answering the watch), ``monitor`` (journals -> referee -> verdict),
``present`` (what is printed and written), ``control`` (the launch command's processes), ``cli``.
Nothing here is imported at package import: the rank side must stay cheap (see docs/watch.md).
"""
