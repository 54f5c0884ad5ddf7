"""The canary: the newest releases of what the project runs with, in a fresh virtual environment,
against accelerate's own test programs and the suites at world 2; writes a drift report (each
package's CI pin against its newest release, and what broke with which newest one).

Usage: python3 .ci/canary.py [--out canary-report.md] [--workdir DIR]   (.github/workflows/canary.yml
runs it weekly). Exit status: 0 when everything ran green, 1 when something broke or a newer release
broke a suite's set-up (its tests skip, saying so: pytest_nccl.testing.releases), 2 when the
environment could not be built. Set TORCH_INDEX_URL to PyTorch's CPU wheel index where pip would
otherwise fetch a CUDA build.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
# installed into the venv, newest each
NEWEST = ("torch", "accelerate", "transformers", "trl", "deepspeed", "datasets", "megatron-core")
# installed --no-deps, each in a directory of its own outside the venv: in it vLLM would make TRL's
# GRPO trainer import it and fail (as in .ci/run); the report says whether the newest one installs
SIDE = ("vllm", "verl", "openrlhf")
# which packages a failure in each place can come from: where it broke names the newest releases there
SUSPECTS = {
    "accelerate programs": ("accelerate", "torch"),
    "suites/trl": ("trl", "transformers", "accelerate", "datasets", "torch"),
    "suites/zero": ("deepspeed", "transformers", "trl", "accelerate", "torch"),
    "suites/modern": ("torch",),
    "suites/launch": ("torch",),
    "suites/verl": ("verl", "transformers", "torch"),
    "suites/pipeline": ("megatron-core", "torch"),
    "suites/moe": ("megatron-core", "torch"),
}
RUN_TIMEOUT = 1800  # one pytest run; longer is itself a hang


@dataclass
class Run:
    """One pytest run of the canary: where, its exit status, its gate report and failed tests."""
    label: str
    args: list[str]
    rc: int | None = None
    seconds: float = 0.0
    gate: str = ""
    failed: list[str] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)  # skips: a newer release broke the set-up


def sh(cmd: list[str], log: Path, env: dict | None = None, timeout: float | None = None) -> int:
    """Run ``cmd`` with its output appended to ``log``; its exit status (124 past ``timeout``)."""
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                  stdin=subprocess.DEVNULL, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            f.write(f"canary: timed out after {timeout} s\n")
            return 124


def pins() -> dict[str, str]:
    """name -> version pinned in .ci/constraints.txt (lower-case names)."""
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def installed(python: str, names, paths=None) -> dict[str, str]:
    """name -> version of ``names`` as ``python`` sees them (in ``paths`` when given)."""
    code = ("import importlib.metadata as md, json, sys\n"
            "paths = json.loads(sys.argv[2]) or None\n"
            "out = {}\n"
            "for n in json.loads(sys.argv[1]):\n"
            "    found = [d.version for d in md.distributions(name=n, path=paths)] if paths else []\n"
            "    try:\n"
            "        out[n] = found[0] if found else md.version(n)\n"
            "    except md.PackageNotFoundError:\n"
            "        pass\n"
            "print(json.dumps(out))")
    proc = subprocess.run([python, "-c", code, json.dumps(list(names)), json.dumps(paths or [])],
                          capture_output=True, text=True)
    return json.loads(proc.stdout or "{}")


def junit_cases(junit: Path) -> list[tuple[str, ET.Element]]:
    """(node id, testcase element) of each test in a JUnit file (none when it is missing)."""
    if not junit.exists():
        return []
    return [(f"{case.get('classname', '')}::{case.get('name', '')}", case)
            for case in ET.parse(junit).getroot().iter("testcase")]


def failed_tests(cases: list[tuple[str, ET.Element]]) -> list[str]:
    """Node ids of the tests that failed or errored."""
    return [nodeid for nodeid, case in cases if case.find("failure") is not None or case.find("error") is not None]


# the words of pytest_nccl.testing.releases.setup_break's skip reason
UNJUDGED = "newer than the suites know"


def unjudged_tests(cases: list[tuple[str, ET.Element]]) -> list[str]:
    """'node id: reason' of the tests skipped because a newer release broke their set-up."""
    out = []
    for nodeid, case in cases:
        skipped = case.find("skipped")
        if skipped is not None and UNJUDGED in skipped.get("message", ""):
            out.append(f"{nodeid}: {skipped.get('message')}")
    return out


def place_of(nodeid: str) -> str:
    """The suite a failed test belongs to ('suites/trl'), or the accelerate programs."""
    if "canary_tests" in nodeid:
        return "accelerate programs"
    parts = nodeid.replace(".", "/").split("/")
    return "/".join(parts[:2]) if parts[0] == "suites" and len(parts) > 1 else parts[0]


def report(date: str, pinned: dict, newest: dict, side: dict, runs: list[Run], probe: Run, notes: list[str]) -> str:
    lines = [f"# Canary: the newest releases ({date})", "",
             "| package | CI pin (.ci/constraints.txt) | newest | |", "|---|---|---|---|"]
    for name in (*NEWEST, *SIDE):
        new = newest.get(name) or side.get(name) or "did not install"
        pin = pinned.get(name, "not pinned")
        if name not in newest and name not in side:
            mark = "did not install"
        elif name not in pinned:
            mark = "no pin to compare"
        else:
            mark = "same" if new.split("+")[0] == pin else "newer"
        if name in SIDE:
            mark += " (--no-deps, not run)"
        lines.append(f"| {name} | {pin} | {new} | {mark} |")
    lines.append("")
    broken = [r for r in runs if r.rc != 0]
    unjudged = [u for r in runs for u in r.unjudged]
    lines.append("## Verdict: " + ("broken with the newest releases" if broken else
                                   "the suites cannot set up on the newest releases" if unjudged else
                                   "green with the newest releases"))
    for r in runs:
        lines.append(f"- {r.label}: exit {r.rc} in {r.seconds:.0f} s")
    for r in broken:
        by_place: dict[str, list[str]] = {}
        for nodeid in r.failed:
            by_place.setdefault(place_of(nodeid), []).append(nodeid)
        for where, ids in by_place.items():
            drifted = [f"{n} {newest.get(n)} (pin {pinned.get(n, '-')})" for n in SUSPECTS.get(where, NEWEST)
                       if newest.get(n) and newest.get(n, "").split("+")[0] != pinned.get(n)]
            lines.append(f"- broke: {where} ({len(ids)} test{'s' if len(ids) != 1 else ''}: {', '.join(ids[:5])}"
                         f"{' ...' if len(ids) > 5 else ''}) with {', '.join(drifted) or 'no newer release there'}")
        if not r.failed:
            lines.append(f"- broke: {r.label} (exit {r.rc}, no failed test recorded: see the log)")
    lines += [f"- set-up broke (skipped): {u}" for u in unjudged]
    # known and documented, not drift: docs/support.md (the plugin builds the state for its tests)
    lines.append(f"- accelerate's own bare `PartialState()` (its state reset in the test) counts a CPU group "
                 f"(accelerate >= 1.13.0: no, docs/support.md): "
                 f"{'yes' if probe.rc == 0 else 'no'} (exit {probe.rc})")
    lines += [f"- {n}" for n in notes]
    for r in runs:
        if r.gate:
            lines += ["", f"## Gate report: {r.label}", "", r.gate.strip()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="canary-report.md", help="the drift report (markdown)")
    parser.add_argument("--workdir", help="where the venv and logs go (default: a new temporary directory)")
    parser.add_argument("--torch", default="torch",
                        help="the torch requirement (default: the newest; a machine that cannot reach a CPU "
                             "index holds it, e.g. torch==2.13.0, and the report says so)")
    args = parser.parse_args(argv)
    if not os.environ.get("TORCH_INDEX_URL") and args.torch == "torch":
        print("canary: no TORCH_INDEX_URL: pip may fetch PyPI's CUDA build of torch", file=sys.stderr)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pytest-nccl-canary-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "canary.log"
    date = datetime.date.today().isoformat()
    print(f"canary: working in {work} (log: {log})", flush=True)
    index = os.environ.get("TORCH_INDEX_URL")
    venv = work / "venv"
    py = str(venv / "bin" / "python")
    held = work / "torch-held.txt"  # the rest resolves around the torch installed first, never over it
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [py, "-m", "pip", "install", "-q", "-U", "pip"],
             # torch first, from the CPU index where one is given (PyPI's newest is a CUDA build)
             [py, "-m", "pip", "install", "-q", "-U", args.torch, *(["--index-url", index] if index else [])],
             [py, "-m", "pip", "install", "-q", "-U", *(n for n in NEWEST if n != "torch"), "-e", f"{ROOT}[suites]",
              "pytest-timeout", "-c", str(held), *(["--extra-index-url", index] if index else [])]]
    t0 = time.monotonic()
    for i, step in enumerate(steps):
        if i == 3:
            held.write_text(f"torch=={installed(py, ['torch']).get('torch', '')}\n")
        if sh(step, log) != 0:
            Path(args.out).write_text(f"# Canary ({date})\n\nthe environment could not be built: "
                                      f"`{' '.join(step)}` failed; see {log}\n")
            print(f"canary: set-up failed at {' '.join(step)}; log {log}", file=sys.stderr)
            return 2
    notes = [f"set-up {time.monotonic() - t0:.0f} s"]
    if args.torch != "torch":
        notes.append(f"torch held at `{args.torch}` (--torch): not the newest release")
    side: dict[str, str] = {}
    for name in SIDE:
        target = work / "side" / name
        if sh([py, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "-U", name], log) == 0:
            side.update(installed(py, [name], [str(target)]))
        else:
            notes.append(f"{name}: the newest release did not install with --no-deps (log: {log})")
    sh(["bash", ".ci/deepspeed_setup.sh", py], log)  # DeepSpeed's CPU comm op, outside any test's bound

    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    runs = [Run("accelerate programs", [".ci/canary_tests/test_accelerate_programs.py"]),
            Run("accelerate bare state", [".ci/canary_tests/test_accelerate_bare_state.py"]),  # alone: its docstring
            Run("suites at world 2", ["suites/"])]
    for r in runs:
        slug = r.label.replace(" ", "-")
        gate, junit = work / f"gate-{slug}.md", work / f"junit-{slug}.xml"
        started = time.monotonic()
        r.rc = sh([py, "-m", "pytest", "--nccl-world=2", *r.args, "-q", "-p", "no:cacheprovider", "-rfEX",
                   f"--nccl-report={gate}", f"--junitxml={junit}"], log, env, RUN_TIMEOUT)
        r.seconds = time.monotonic() - started
        r.gate = gate.read_text() if gate.exists() else ""
        cases = junit_cases(junit)
        r.failed, r.unjudged = failed_tests(cases), unjudged_tests(cases)
        print(f"canary: {r.label}: exit {r.rc} in {r.seconds:.0f} s", flush=True)
    probe = Run("bare PartialState", [".ci/canary_tests/test_accelerate_count.py"])
    probe.rc = sh([py, "-m", "pytest", *probe.args, "-q", "-p", "no:cacheprovider"], log, env, RUN_TIMEOUT)
    newest = installed(py, NEWEST)
    text = report(date, pins(), newest, side, runs, probe, notes)
    Path(args.out).write_text(text)
    print(text, flush=True)
    return 0 if all(r.rc == 0 and not r.unjudged for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
