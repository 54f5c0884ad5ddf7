"""The watch's front-ends, each built on ``engine.job.Engine``: the command ``pytest-nccl watch``
(``cli``, ``options``) and the follower of the ranks a pytest test starts itself (``intest``,
``testwatch``, ``testprocs``; ``launched.py`` is its pytest side)."""
