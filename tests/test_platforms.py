"""Importing the plugin never breaks a session: where ranks cannot run (Windows, macOS) tests marked
nccl skip with one line saying why and every other test runs. Simulated on Linux in a subprocess:
``sys.platform`` set, ``fcntl`` unimportable, the POSIX-only signals, ``socket.AF_UNIX`` and
``os.fork`` removed, before pytest loads the plugin. Only this plugin is loaded (by name, autoload off):
the host's other plugins need not survive a simulated platform (pytest-mock's ``import asyncio`` takes
Windows' event loop on "win32" and fails on Linux)."""

import os
import subprocess
import sys
import textwrap

import pytest

SIMULATE = """
import os, signal, socket, sys
sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows
for name in ("SIGUSR1", "SIGUSR2", "SIGKILL"):
    if hasattr(signal, name):
        delattr(signal, name)
delattr(socket, "AF_UNIX")
delattr(os, "fork")
sys.platform = sys.argv.pop(1)
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""

TESTS = """
import pytest

@pytest.mark.nccl(world=2)
def test_marked(rank):
    raise AssertionError("must not run")

def test_from_the_controller(nccl_world):
    raise AssertionError("must not run")

def test_plain():
    pass
"""


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_marked_tests_skip_with_one_line_and_the_others_run(tmp_path, platform):
    (tmp_path / "simulate.py").write_text(SIMULATE)
    (tmp_path / "test_platform.py").write_text(textwrap.dedent(TESTS))
    # -s: pytest's own fd capture has a Windows-only branch that a simulation on Linux cannot take
    proc = subprocess.run([sys.executable, "simulate.py", platform, "-s", "-rs", "-p", "no:cacheprovider",
                           "-p", "pytest_nccl.plugin", "test_platform.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    reason = f"pytest-nccl runs distributed tests on Linux only (this is {platform})"
    assert f"SKIPPED [1] test_platform.py:4: {reason}" in out
    assert f"test_platform.py:8: {reason}" in out
    assert "1 passed, 2 skipped" in out
