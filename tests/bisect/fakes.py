"""Fakes shared by the bisect and matrix CLI tests (imported as ``fakes``: pytest puts this folder
on sys.path for its test modules)."""

from pytest_nccl.bisect.envs import EnvBuildError


class FakeBuilder:
    """Builds an "env" that is a directory with bin/python and a version file; ``uninstallable``
    versions fail as a resolver would."""

    name = "fake"

    def __init__(self, uninstallable=()):
        self.calls = []
        self.uninstallable = set(uninstallable)

    def build(self, request, path, base, log):
        self.calls.append(request.version)
        if request.version in self.uninstallable:
            raise EnvBuildError("No solution found when resolving dependencies")
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").write_text("")
        (path / "version").write_text(request.version)
