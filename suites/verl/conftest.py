"""verl regression suite: verl's own dynamic-batching code on N CPU ranks (gloo, FSDP2), tiny
models built from configs, no downloads. Run: ``pytest --nccl-world=2 suites/verl`` (README.md).

Without verl installed every test module skips (``pytest.importorskip``): the suite run of the
README passes on the project's own venv, which has no verl.
"""

from pytest_nccl.testing import hf_offline_env

hf_offline_env()
