"""Bisecting releases (and commits) of a library against a pytest selection.

- :mod:`.versions`: which releases lie between two bounds (PyPI JSON API, pip, or a given list)
- :mod:`.search`: pure bisect / sweep over a verdict function (good / bad / skip)
- :mod:`.envs`: cached per-version envs layered on the installed torch
- :mod:`.builders`: how an env is built (uv with the release date's deps, else pip) and checked
- :mod:`.runner`: run pytest in an env, verdict + diagnosis headline from its JUnit XML
- :mod:`.prober`: the verdict function that glues envs and runner
- :mod:`.cli`: ``python -m pytest_nccl bisect``
- :mod:`.matrix`: the release matrix (``pytest-nccl matrix``), a subpackage: results and cells,
  findings (with the notes file), Markdown (pure), and its command
"""
