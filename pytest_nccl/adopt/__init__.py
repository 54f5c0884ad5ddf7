"""Adopted harnesses: the distributed tests a suite already has, written against torch's
``MultiProcessTestCase`` family, run with their ranks from the fork server under this plugin's
bound, trace and diagnosis (``--nccl-adopt``, on by default; docs/adopt.md)."""
