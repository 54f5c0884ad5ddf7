"""Python 3.10 has no tomllib: the matrix's notes file, the plugin's entry points and the tooling
requirements are read with tomli there. Simulated here: tomllib unimportable, and a ``tomli`` that is
the standard library's parser loaded under the backport's name."""

import subprocess
import sys
import textwrap

SIMULATE = textwrap.dedent("""
    import importlib.machinery, importlib.util, sys
    spec = importlib.machinery.PathFinder.find_spec("tomllib")
    tomli_spec = importlib.util.spec_from_file_location("tomli", spec.origin,
                                                        submodule_search_locations=spec.submodule_search_locations)
    tomli = importlib.util.module_from_spec(tomli_spec)
    sys.modules["tomli"] = tomli
    tomli_spec.loader.exec_module(tomli)
    sys.modules["tomllib"] = None  # `import tomllib` fails, as on Python 3.10

    from pytest_nccl.bisect.matrix.findings import parse_about, parse_notes
    notes = parse_notes('[[note]]\\nrows = ["cpo · *"]\\ntext = "known"\\n')
    assert [n.text for n in notes] == ["known"], notes
    assert parse_about('about = "page"') == "page"
    from pytest_nccl.bisect.runner import plugin_entry_points
    assert plugin_entry_points()[1] == {"nccl": "pytest_nccl.plugin"}
    print("ok")
""")


def test_toml_is_read_without_tomllib():
    proc = subprocess.run([sys.executable, "-c", SIMULATE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
