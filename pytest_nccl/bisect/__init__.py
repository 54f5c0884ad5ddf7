"""Bisecting releases (and commits) of a library against a pytest selection.

- :mod:`.versions`: which releases lie between two bounds (PyPI JSON API, pip, or a given list)
- :mod:`.search`: pure bisect / sweep over a verdict function (good / bad / skip)
- :mod:`.envs`: cached per-version envs layered on the installed torch
- :mod:`.builders`: how an env is built (uv with the release date's deps, else pip) and checked
- :mod:`.runner`: run pytest in an env, verdict + diagnosis headline from its JUnit XML
- :mod:`.prober`: the verdict function that glues envs and runner
- :mod:`.cli`: ``python -m pytest_nccl bisect``
- :mod:`.matrix`, :mod:`.matrix_findings`, :mod:`.matrix_render`: the release matrix's results and
  cells, its findings (with the notes file), its Markdown (pure)
- :mod:`.matrix_cli`: ``python -m pytest_nccl matrix``
"""
