"""What ``pytest-nccl bisect`` prints: a progress line per probed release (env built or cached, test
time, verdict) and the final verdicts of a bisect and of a sweep."""

from __future__ import annotations

from typing import TextIO

from packaging.version import Version

from .runner import RunOutcome
from .search import BisectResult, Direction, Probe, SweepResult, Verdict

DASH = "\u2014"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class TerminalReporter:
    """Progress lines: which version is probed, install time, test time, verdict."""

    def __init__(self, out: TextIO, total: int | None = None, verbose: bool = False):
        self.out = out
        self.total = total
        self.verbose = verbose

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _part(self, text: str) -> None:
        if self.verbose:
            self.line(text.strip())
        else:
            self.out.write(text)
            self.out.flush()

    def probe_started(self, n: int, package: str, version: str, role: str | None) -> None:
        tag = f"[{n}/{self.total}]" if self.total else f"[{n}]"
        role_s = f" ({role})" if role else ""
        self._part(f"{tag} {package} {version}{role_s}: env ")

    def env_ready(self, result) -> None:
        if result.cached:
            what = "cached" if result.ok else "cached failure"
            built = f", built in {fmt_seconds(result.build_seconds)}" if result.build_seconds else ""
            self._part(f"{what} ({fmt_seconds(result.seconds)}{built})")
        else:
            self._part(("built" if result.ok else "failed") + f" in {fmt_seconds(result.seconds)}")
        if result.ok:
            self._part(", tests ")

    def tests_done(self, outcome: RunOutcome) -> None:
        self._part(fmt_seconds(outcome.seconds))

    def probe_done(self, version: str, probe: Probe) -> None:
        verdict = {Verdict.GOOD: "good", Verdict.BAD: "BAD", Verdict.SKIP: "skip"}[probe.verdict]
        extra = f": {probe.headline}" if probe.headline else ""
        self._part(f" -> {verdict}{extra}\n")
        if probe.verdict is Verdict.SKIP and probe.detail:
            self.line(f"      log: {probe.detail}")

    def step(self, remaining: int, steps: int) -> None:
        self.line(f"bisecting: {remaining} untested release{'s' if remaining != 1 else ''} left, "
                  f"about {steps} more probe{'s' if steps != 1 else ''}")


def render_bisect(result: BisectResult, package: str) -> list[str]:
    lines = ["", "probed:"]
    for v in sorted(result.probes, key=Version):
        p = result.probes[v]
        extra = f"  {p.headline}" if p.headline else ""
        lines.append(f"  {v:<12} {p.verdict.value:<5}{extra}".rstrip())
    if result.mode is Direction.REGRESSION:
        head = result.first_probe.headline if result.first_probe else None
        final = f"first bad: {package} {result.first}"
    else:
        last = result.probes.get(result.last_old)
        head = last.headline if last else None
        final = f"first fixed: {package} {result.first}"
        if head:
            head = f"last bad {result.last_old}: {head}"
    if result.ambiguous:
        lines.append(f"note: {', '.join(result.ambiguous)} could not be tested; "
                     f"the {result.mode.label} release is one of "
                     f"{', '.join(result.ambiguous + [result.first])}")
        final += f" (or one of the untested {', '.join(result.ambiguous)})"
    if head:
        final += f" {DASH} {head}"
    lines.append(final)
    return lines


def render_sweep(result: SweepResult, package: str) -> list[str]:
    lines = ["", "sweep:"]
    for v in result.versions:
        p = result.probes[v]
        extra = f"  {p.headline}" if p.headline else ""
        lines.append(f"  {v:<12} {p.verdict.value:<5}{extra}".rstrip())
    bad = result.bad
    if not result.good and not bad:
        lines.append(f"no release of {package} in the range could be tested")
        return lines
    if not bad:
        lines.append(f"no bad release: {package} {result.versions[0]} .. {result.versions[-1]} "
                     f"({len(result.good)} good, {len(result.skipped)} skipped)")
        return lines
    runs = []
    for run in result.bad_runs():
        runs.append(run[0] if len(run) == 1 else f"{run[0]} .. {run[-1]}")
    head = result.probes[bad[0]].headline
    alone = " alone" if len(bad) == 1 else ""
    final = f"bad: {package} {'; '.join(runs)}{alone}"
    if head:
        final += f" {DASH} {head}"
    lines.append(final)
    return lines
