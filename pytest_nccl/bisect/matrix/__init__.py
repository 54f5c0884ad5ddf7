"""The release matrix (``pytest-nccl matrix``): a pytest selection over many releases and world sizes.

- :mod:`.results`: the results model (one run per release and world size), row labels and cells (pure)
- :mod:`.findings`: what is red since when, and the notes file (pure)
- :mod:`.render`: the Markdown page (pure)
- :mod:`.cli`: the command, on bisect's cached envs and pytest runner
"""
