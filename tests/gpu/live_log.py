"""A pytest plugin for runs that may be cut off: each failed test's report is appended to the file
``$PYTEST_LIVE_LOG`` the moment it is known (xdist's controller gets its workers' reports here too),
so a run killed by its time limit still says why each test failed, not only that it did.
Used by ``run_gpu_host.sh`` as ``-p live_log``."""

import os


def pytest_runtest_logreport(report):
    path = os.environ.get("PYTEST_LIVE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # xdist's controller writes
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")
