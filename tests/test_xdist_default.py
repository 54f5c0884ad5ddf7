"""Plain ``pytest`` runs the project's tests on 2 xdist workers (tests/conftest.py), and a worker never
starts workers of its own: it gets no ``-n`` from its controller, and would otherwise take the
default again, each of its workers too, without end (a fork bomb that a plain ``pytest`` met)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import conftest
import pytest


def config(**extra) -> SimpleNamespace:
    options = {"markexpr": "", "usepdb": False}
    return SimpleNamespace(option=SimpleNamespace(numprocesses=None, dist="no", collectonly=False),
                           args_source=pytest.Config.ArgsSource.TESTPATHS,
                           getoption=lambda name, default=None: options.get(name, default), **extra)


def test_plain_pytest_runs_on_two_workers(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    c = config()
    conftest.pytest_cmdline_main(c)
    assert c.option.numprocesses == min(conftest.XDIST_WORKERS, os.cpu_count() or 1)
    assert c.option.dist == "loadfile"


def test_an_xdist_worker_starts_no_workers_of_its_own(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    c = config(workerinput={"workerid": "gw0"})
    conftest.pytest_cmdline_main(c)
    assert c.option.numprocesses is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    c = config()
    conftest.pytest_cmdline_main(c)
    assert c.option.numprocesses is None
