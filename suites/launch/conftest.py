"""Failures users meet when their job is started by a launcher (torchrun, srun, Ray): a rendezvous
peer that never joins (OpenRLHF) and a rank much slower than the others (verl). Each case is written
so that the suite is green when pytest-nccl diagnoses it right: ``xfail(raises=..., strict=True)``
on the exception class, and the project's own tests (``tests/test_spmd.py``) check the headline.

Runs both ways, at any world size (checked at 2, 3 and 4; no test pins one): the odd rank is rank 0
(rendezvous) or the last rank (slow rollout), so each headline names one rank.
    pytest --nccl-world=2 suites/launch                        # the plugin starts the ranks
    torchrun --nproc-per-node=2 -m pytest suites/launch        # SPMD: each launched process is a rank
"""
