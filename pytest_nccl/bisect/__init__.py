"""Bisecting releases (and commits) of a library against a pytest selection.

- :mod:`.versions`: which releases lie between two bounds (PyPI JSON API, pip, or a given list)
- :mod:`.search`: pure bisect / sweep over a verdict function (good / bad / skip)
- :mod:`.envs`: cached per-version envs layered on the installed torch
- :mod:`.runner`: run pytest in an env, verdict + diagnosis headline from its JUnit XML
- :mod:`.prober`: the verdict function that glues envs and runner
- :mod:`.exitcodes`: exit-status mapping for ``git bisect run`` (used by the plugin)
- :mod:`.cli`: ``python -m pytest_nccl bisect``
"""
