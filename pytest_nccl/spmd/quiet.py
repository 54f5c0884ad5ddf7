"""Ranks other than 0 show nothing: rank 0 reports for every rank."""

from __future__ import annotations

import dataclasses

import pytest

from ..session import junit_writer


def silence(config: pytest.Config, nccl) -> None:
    """No terminal reporter (the name is blocked before pytest registers it), JUnit XML, gate report
    or trace dir on this rank."""
    config.pluginmanager.set_blocked("terminalreporter")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # registered already (another plugin order)
        config.pluginmanager.unregister(reporter)
        config.pluginmanager.set_blocked("terminalreporter")
    for name in ("xmlpath", "nccl_report"):
        if hasattr(config.option, name):
            setattr(config.option, name, None)
    nccl.settings = dataclasses.replace(nccl.settings, trace_dir=None, report=None)
    xml = junit_writer(config)
    if xml is not None:
        config.pluginmanager.unregister(xml)
