"""Pure search logic: bisect and sweep over a verdict function.

Nothing here installs or runs anything: the caller passes ``probe(version) -> Probe`` and the
ordered list of versions. The direction comes from which bound is newer:

- ``good`` older than ``bad``: a regression; the answer is the *first bad* version.
- ``good`` newer than ``bad``: a fix; the answer is the *first fixed* (first good) version.

In both cases the search looks for the first version (ascending) whose state is that of the newer
bound ("new") while everything before it has the older bound's state ("old"), exactly like
``git bisect`` with its old/new terms. A version that cannot be tested (install or import failed,
no tests ran) is a SKIP: the search then probes the closest untested version to the middle, and if
only skipped versions are left between the last old and the first new one, the answer names them
as possible culprits (``ambiguous``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Sequence

from packaging.version import Version


class Verdict(str, enum.Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


class Direction(str, enum.Enum):
    """What a bisect looks for, from the order of its bounds."""
    REGRESSION = "regression"  # good older than bad: the first bad release
    FIX = "fix"                # bad older than good: the first fixed release

    @property
    def label(self) -> str:
        return "first bad" if self is Direction.REGRESSION else "first fixed"


@dataclass
class Probe:
    """What one probed version gave."""

    verdict: Verdict
    #: one line: the diagnosis headline of the first failure (BAD) or why it was skipped (SKIP)
    headline: str | None = None
    install_seconds: float | None = None
    test_seconds: float | None = None
    env_cached: bool = False
    detail: str | None = None


class BoundsError(Exception):
    """A bound does not have the state the user claimed (or cannot be tested)."""

    def __init__(self, message: str, version: str, probe: Probe):
        super().__init__(message)
        self.version = version
        self.probe = probe


@dataclass
class BisectResult:
    mode: Direction
    first: str  # the first version with the newer bound's state
    last_old: str  # the last version known to have the older bound's state
    #: skipped versions between last_old and first: any of them may be the real answer
    ambiguous: list[str] = field(default_factory=list)
    probes: dict[str, Probe] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # versions in the order they were probed

    @property
    def label(self) -> str:
        return self.mode.label

    @property
    def first_probe(self) -> Probe | None:
        return self.probes.get(self.first)


@dataclass
class SweepResult:
    versions: list[str]
    probes: dict[str, Probe]

    def with_verdict(self, verdict: Verdict) -> list[str]:
        return [v for v in self.versions if self.probes[v].verdict is verdict]

    @property
    def bad(self) -> list[str]:
        return self.with_verdict(Verdict.BAD)

    @property
    def good(self) -> list[str]:
        return self.with_verdict(Verdict.GOOD)

    @property
    def skipped(self) -> list[str]:
        return self.with_verdict(Verdict.SKIP)

    def bad_runs(self) -> list[list[str]]:
        """Maximal runs of consecutive BAD versions (skips neither break nor extend a run)."""
        runs: list[list[str]] = []
        cur: list[str] = []
        for v in self.versions:
            verdict = self.probes[v].verdict
            if verdict is Verdict.BAD:
                cur.append(v)
            elif verdict is Verdict.GOOD:
                if cur:
                    runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        return runs


def direction(good: str, bad: str) -> Direction:
    """A regression when good is older than bad, a fix when newer."""
    g, b = Version(good), Version(bad)
    if g == b:
        raise ValueError(f"--good and --bad are the same version ({good})")
    return Direction.REGRESSION if g < b else Direction.FIX


def steps_left(n_between: int) -> int:
    """Roughly how many more probes a bisect needs with ``n_between`` untested versions."""
    steps = 0
    while n_between > 0:
        n_between //= 2
        steps += 1
    return steps


def _pick_middle(candidates: Sequence[int], lo: int, hi: int) -> int:
    mid = (lo + hi) / 2
    return min(candidates, key=lambda i: (abs(i - mid), i))


def bisect(versions: Sequence[str], good: str, bad: str, probe: Callable[[str], Probe], *,
           check_bounds: bool = True,
           on_step: Callable[[int, int], None] | None = None) -> BisectResult:
    """Binary-search ``versions`` (ascending, bounds included) between ``good`` and ``bad``.

    ``check_bounds`` probes both bounds first and raises :class:`BoundsError` when the older
    bound already has the newer state, the newer bound still has the older state, or a bound
    cannot be tested. ``on_step(remaining, steps)`` is called before each probe inside the range.
    """
    mode = direction(good, bad)
    old_state, new_state = (Verdict.GOOD, Verdict.BAD) if mode is Direction.REGRESSION else (Verdict.BAD, Verdict.GOOD)
    ordered = sorted(versions, key=Version)
    index = {Version(v): i for i, v in enumerate(ordered)}
    older, newer = (good, bad) if mode is Direction.REGRESSION else (bad, good)
    try:
        lo, hi = index[Version(older)], index[Version(newer)]
    except KeyError as e:
        raise ValueError(f"bound {e.args[0]} is not in the version list") from None
    ordered = ordered[lo:hi + 1]
    lo, hi = 0, len(ordered) - 1

    result = BisectResult(mode=mode, first=ordered[hi], last_old=ordered[lo])
    memo: dict[str, Probe] = result.probes

    def run(i: int) -> Probe:
        v = ordered[i]
        if v not in memo:
            memo[v] = probe(v)
            result.order.append(v)
        return memo[v]

    if check_bounds:
        for i, expected in ((lo, old_state), (hi, new_state)):
            p = run(i)
            v = ordered[i]
            claimed = "good" if expected is Verdict.GOOD else "bad"
            if p.verdict is Verdict.SKIP:
                raise BoundsError(f"bound {v} could not be tested: {p.headline or 'skipped'}", v, p)
            if p.verdict is not expected:
                raise BoundsError(f"bound {v} was given as {claimed} but tested {p.verdict.value}"
                                  + (f": {p.headline}" if p.headline else ""), v, p)

    skipped: set[int] = set()
    while True:
        candidates = [i for i in range(lo + 1, hi) if i not in skipped]
        if not candidates:
            break
        if on_step:
            on_step(len(candidates), steps_left(len(candidates)))
        i = _pick_middle(candidates, lo, hi)
        p = run(i)
        if p.verdict is new_state:
            hi = i
        elif p.verdict is old_state:
            lo = i
        else:
            skipped.add(i)
    result.first = ordered[hi]
    result.last_old = ordered[lo]
    result.ambiguous = [ordered[i] for i in sorted(skipped) if lo < i < hi]
    return result


def sweep(versions: Sequence[str], probe: Callable[[str], Probe],
          on_probe: Callable[[str, Probe], None] | None = None) -> SweepResult:
    """Probe every version (ascending): one verdict each; ``on_probe(version, probe)`` after each (a
    shard keeps what it swept, whatever ends it)."""
    ordered = sorted(versions, key=Version)
    probes: dict[str, Probe] = {}
    for v in ordered:
        probes[v] = probe(v)
        if on_probe is not None:
            on_probe(v, probes[v])
    return SweepResult(versions=ordered, probes=probes)
