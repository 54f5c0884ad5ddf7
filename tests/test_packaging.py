"""Packaging metadata, checked on the files (``.ci/run`` builds the sdist and wheel, runs
``twine check`` and installs the wheel into a fresh environment)."""

import re
from pathlib import Path

import pytest_nccl
from pytest_nccl.bisect import tomlcompat

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomlcompat.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_its_file():
    project = PROJECT["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "pytest-nccl contributors" in text
    # license-files and an SPDX string need setuptools 77
    assert PROJECT["build-system"]["requires"] == ["setuptools>=77"]


def test_classifiers_say_what_is_supported():
    classifiers = PROJECT["project"]["classifiers"]
    assert "Framework :: Pytest" in classifiers and "Operating System :: POSIX :: Linux" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX string says it
    assert "Typing :: Typed" in classifiers and (ROOT / "pytest_nccl" / "py.typed").is_file()
    data = PROJECT["tool"]["setuptools"]["package-data"]["pytest_nccl"]
    assert "py.typed" in data
    # the swimlane page's template is a data file: a wheel without it writes no page
    assert "views/*.html" in data and (ROOT / "pytest_nccl" / "views" / "swimlane.html").is_file()


def test_urls_and_authors():
    project = PROJECT["project"]
    assert project["authors"] == [{"name": "pytest-nccl contributors"}]
    assert set(project["urls"]) >= {"Homepage", "Source", "Issues", "Changelog"}
    assert all(u.startswith("https://github.com/pytest-nccl/pytest-nccl") for u in project["urls"].values())


def test_the_version_is_written_once():
    version = PROJECT["project"]["version"]
    sources = [p for p in (ROOT / "pytest_nccl").rglob("*.py") if re.search(rf"['\"]{re.escape(version)}['\"]",
                                                                             p.read_text())]
    assert sources == []
    assert pytest_nccl.__version__  # the installed metadata's, or 0+unknown from a bare source tree
    assert f"## {version} " in (ROOT / "CHANGELOG.md").read_text()


def test_the_sdist_carries_license_docs_tests_and_suites():
    manifest = (ROOT / "MANIFEST.in").read_text().split()
    for name in ("LICENSE", "CHANGELOG.md", "README.md"):
        assert name in manifest
    for directory in ("docs", "tests", "suites"):
        assert re.search(rf"^graft {directory}$", (ROOT / "MANIFEST.in").read_text(), re.M)


def test_the_readme_renders_on_a_package_index():
    """A package index shows the README without the repository: images are absolute; links are
    relative (an offline clone reads them; tests/test_readme.py resolves them), so the README names
    the repository's tree they lie in."""
    readme = (ROOT / "README.md").read_text()
    assert re.findall(r"!\[[^]]*\]\((?!https://)([^)]+)\)", readme) == []
    assert "https://raw.githubusercontent.com/pytest-nccl/pytest-nccl/main/docs/swimlane-world8.png" in readme
    assert "https://github.com/pytest-nccl/pytest-nccl/tree/main" in readme
