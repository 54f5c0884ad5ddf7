"""The README as a newcomer meets it: its first screen has the install and a first test, its set-up
and run commands for a clone are the ones CI (.ci/run) runs, and every relative link in it and in
docs/*.md resolves to a file (and heading) of the repository, as in an offline clone."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
FIRST_SCREEN = 45   # lines: a terminal or a repository page's first view
# What .ci/run adds to the README's commands for its own sake: build and twine for its packaging
# step; quieter output, no cache, the summary of failures and the gate report for its log.
CI_ONLY_PACKAGES = {"build", "twine"}
CI_LOG_OPTIONS = re.compile(r"^(-q|-r\w+|--nccl-report=.*|no:cacheprovider)$")


def blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """Each fenced block: (its first line's number, its language, its lines)."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            found.append((i + 1, m.group(1), [line.strip() for line in lines[i + 1:end]]))
            i = end
        i += 1
    return found


def ci_commands(prefix: str) -> list[list[str]]:
    """The .ci/run lines that start with ``prefix`` (continuations joined), as words without the
    shell's ``${VAR:+...}`` expansions (the CPU index, set only where there is no local wheel)."""
    text = re.sub(r"\\\n\s*", " ", CI_RUN.read_text())
    text = re.sub(r"\$\{[^}]*\}", "", text)
    return [shlex.split(line.strip(), comments=True)
            for line in text.splitlines() if line.strip().startswith(prefix + " ")]


def readme_section(heading: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_first_screen_has_the_headline_the_install_and_a_first_test():
    screen = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    assert re.search(r"^(shape|op) mismatch in \w+ #\d+ of group default: ", screen, re.M), "no headline"
    assert "pip install pytest-nccl" in screen
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in screen
    assert "@pytest.mark.nccl" in screen and "def test_" in screen
    assert "pytest --nccl-world=2" in screen


def test_ci_runs_the_readmes_first_example():
    """.ci/run runs the first python block against the wheel: it is the one of the first screen."""
    out = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_example.py"), str(README)],
                         capture_output=True, text=True, check=True).stdout
    compile(out, "readme_example", "exec")
    first_python = next(start for start, lang, _ in blocks(README.read_text()) if lang == "python")
    assert first_python < FIRST_SCREEN
    assert "def test_known_desync" in out   # its xfailed desync leaves the trace CI looks for


def test_the_set_up_commands_are_the_ones_ci_runs():
    commands = [line for _, _, block in blocks(readme_section("Working on this repository"))
                for line in block]
    installs = [shlex.split(c) for c in commands if c.startswith("pip install")]
    ci = [words[1:] for words in ci_commands("quiet_pip")][:2]   # the set-up step's two installs
    assert len(installs) == 2 and len(ci) == 2
    assert [words[2:] for words in installs] == [[w for w in words if w not in CI_ONLY_PACKAGES]
                                                 for words in ci]
    # the virtual environment CI makes, in the README's words
    assert any(c.startswith("python3 -m venv .venv") and ". .venv/bin/activate" in c for c in commands)
    assert "python3 -m venv .venv" in CI_RUN.read_text() and ". .venv/bin/activate" in CI_RUN.read_text()


def test_the_run_commands_are_the_ones_ci_runs():
    section = readme_section("Working on this repository")
    runs = [shlex.split(line) for _, _, block in blocks(section) for line in block
            if line.startswith("pytest")]
    assert runs == [["pytest", "--nccl-world=2", "suites/"], ["pytest"]]
    ci = [[w for w in words[1:] if not CI_LOG_OPTIONS.match(w) and w != "-p"]
          for words in ci_commands("run_pytest") if words[1] == "pytest"]
    for words in runs:
        assert words in ci, f"{' '.join(words)}: .ci/run does not run it"
    assert "min" in section and "~/.cache" in section   # how long each takes; where the op goes


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"^\s*```.*?^\s*```", "", path.read_text(), flags=re.M | re.S)   # code is not links
    return re.findall(r"\]\((?!https?://|mailto:)([^)\s]+)\)", text)


DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for link in relative_links(path):
        target, _, anchor = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(link)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(link)
    assert broken == []


def test_the_readme_links_every_docs_page():
    """The README is the map: a page it does not link is a page nobody finds."""
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in relative_links(README)}
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked) == []


def test_the_readme_stays_a_map():
    assert len(README.read_text().splitlines()) <= 200
