"""The directory ``pytest-nccl watch`` puts first on the job's ``PYTHONPATH``: it holds the
``sitecustomize.py`` that every Python process of the job runs at start-up. Never imported as a
package."""
