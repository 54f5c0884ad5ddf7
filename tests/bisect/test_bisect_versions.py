"""Release listing and range selection, on fake index documents (no network)."""

import io
import json
import subprocess
import urllib.error

import pytest

from pytest_nccl.bisect.versions import (
    IndexError_,
    PipIndex,
    PyPIJsonIndex,
    Release,
    StaticIndex,
    parse_pip_index_output,
    parse_version_list,
    releases_from_pypi_json,
    select_range,
)


def _file(t, yanked=False):
    return {"upload_time_iso_8601": t, "yanked": yanked, "packagetype": "bdist_wheel"}


PYPI_DOC = {
    "info": {"name": "trl"},
    "releases": {
        "0.13.0": [_file("2024-12-16T15:14:49.234744Z"), _file("2024-12-16T15:14:51.033598Z")],
        "0.14.0": [_file("2025-01-29T16:44:02Z")],
        "0.15.0": [_file("2025-02-13T14:37:39Z")],
        "0.15.1": [_file("2025-02-18T14:42:07Z", yanked=True)],
        "0.15.2": [_file("2025-02-25T22:34:32Z")],
        "0.16.0rc1": [_file("2025-03-10T10:00:00Z")],
        "0.16.0": [_file("2025-03-22T21:13:07Z")],
        "0.16.1": [_file("2025-04-04T18:21:47Z")],
        "0.17.0": [],  # no files: cannot be installed
        "not-a-version": [_file("2025-01-01T00:00:00Z")],
    },
}


def test_releases_from_pypi_json_sorted_with_yank_and_dates():
    rels = releases_from_pypi_json(PYPI_DOC)
    assert [r.version for r in rels] == ["0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0rc1",
                                         "0.16.0", "0.16.1"]
    by = {r.version: r for r in rels}
    assert by["0.15.1"].yanked and not by["0.15.0"].yanked
    assert by["0.16.0rc1"].is_prerelease
    assert by["0.13.0"].uploaded.isoformat().startswith("2024-12-16T15:14:49")
    assert by["0.13.0"].uploaded_last.isoformat().startswith("2024-12-16T15:14:51")
    assert by["0.13.0"].uploaded.tzinfo is not None


def test_select_range_leaves_out_prereleases_and_yanked():
    rels = releases_from_pypi_json(PYPI_DOC)
    got = [r.version for r in select_range(rels, "0.13.0", "0.16.1")]
    assert got == ["0.13.0", "0.14.0", "0.15.0", "0.15.2", "0.16.0", "0.16.1"]
    got = [r.version for r in select_range(rels, "0.13.0", "0.16.1", pre=True, yanked=True)]
    assert "0.16.0rc1" in got and "0.15.1" in got


def test_select_range_either_order_and_bounds_kept():
    rels = releases_from_pypi_json(PYPI_DOC)
    a = [r.version for r in select_range(rels, "0.16.1", "0.14.0")]
    b = [r.version for r in select_range(rels, "0.14.0", "0.16.1")]
    assert a == b == ["0.14.0", "0.15.0", "0.15.2", "0.16.0", "0.16.1"]
    # a bound is what the user named: kept even when yanked
    assert [r.version for r in select_range(rels, "0.15.1", "0.15.2")] == ["0.15.1", "0.15.2"]


def test_select_range_unknown_bound_is_an_error():
    rels = releases_from_pypi_json(PYPI_DOC)
    with pytest.raises(IndexError_, match="0.99.0 is not a release"):
        select_range(rels, "0.13.0", "0.99.0")


def test_pypi_json_index_uses_opener_and_canonical_name():
    seen = []

    def opener(url, timeout):
        seen.append(url)
        return json.dumps(PYPI_DOC).encode()

    idx = PyPIJsonIndex("https://example.invalid/pypi/", opener=opener)
    rels = idx.releases("TRL")
    assert seen == ["https://example.invalid/pypi/trl/json"]
    assert rels[0].version == "0.13.0"


def test_pypi_json_index_errors():
    def not_found(url, timeout):
        raise urllib.error.HTTPError(url, 404, "Not Found", {}, io.BytesIO())

    with pytest.raises(IndexError_, match="no such project"):
        PyPIJsonIndex("https://x", opener=not_found).releases("nope")

    def offline(url, timeout):
        raise urllib.error.URLError("offline")

    with pytest.raises(IndexError_, match="cannot reach"):
        PyPIJsonIndex("https://x", opener=offline).releases("trl")

    with pytest.raises(IndexError_, match="JSON"):
        PyPIJsonIndex("https://x", opener=lambda u, t: b"<html>").releases("trl")


def test_pypi_json_env_override(monkeypatch):
    monkeypatch.setenv("PYTEST_NCCL_PYPI_JSON", "https://mirror.invalid/pypi")
    assert PyPIJsonIndex().base_url == "https://mirror.invalid/pypi"


def test_pip_index_output_parsing_and_fake_run():
    text = "trl (0.16.1)\nAvailable versions: 0.16.1, 0.16.0, 0.15.2\n  INSTALLED: 0.16.1\n"
    assert parse_pip_index_output(text) == ["0.16.1", "0.16.0", "0.15.2"]

    def run(cmd, **kw):
        assert cmd == ["python", "-m", "pip", "index", "versions", "trl", "--pre", "--disable-pip-version-check"]
        return subprocess.CompletedProcess(cmd, 0, text, "")

    rels = PipIndex(python="python", run=run).releases("trl")
    assert [r.version for r in rels] == ["0.15.2", "0.16.0", "0.16.1"]

    def fail(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for zzz")

    with pytest.raises(IndexError_, match="No matching distribution"):
        PipIndex(python="python", run=fail).releases("zzz")


def test_static_index_and_version_list():
    assert parse_version_list("0.13.0, 0.14.0 0.15.0,,") == ["0.13.0", "0.14.0", "0.15.0"]
    idx = StaticIndex({"TRL": ["0.15.0", "0.13.0", Release("0.14.0", yanked=True)]})
    assert [r.version for r in idx.releases("trl")] == ["0.13.0", "0.14.0", "0.15.0"]
    with pytest.raises(IndexError_):
        idx.releases("other")
    with pytest.raises(IndexError_, match="not a valid version"):
        StaticIndex({"x": ["banana"]}).releases("x")
