"""TRL regression suite: real TRL trainers on N ranks (gloo on CPU), tiny models, no downloads.

Run: ``pytest --nccl-world=2 suites/trl``.  The distributed machinery is the plugin's;
this file only makes the Hugging Face stack offline and quiet before anything imports it.
"""

from pytest_nccl.testing import hf_offline_env

hf_offline_env()
