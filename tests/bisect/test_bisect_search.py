"""Bisect and sweep logic over a fake verdict function."""

import pytest

from pytest_nccl.bisect.search import (
    BoundsError,
    Direction,
    Probe,
    Verdict,
    bisect,
    direction,
    steps_left,
    sweep,
)

VERSIONS = ["0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.16.1", "0.17.0", "0.18.0",
            "0.19.0"]


class Fake:
    """Verdicts by version; records the probe order."""

    def __init__(self, bad=(), skip=(), headline="shape mismatch in all_gather #3"):
        self.bad, self.skip, self.calls, self.headline = set(bad), set(skip), [], headline

    def __call__(self, v):
        self.calls.append(v)
        if v in self.skip:
            return Probe(Verdict.SKIP, headline="cannot install: no solution")
        if v in self.bad:
            return Probe(Verdict.BAD, headline=f"{self.headline} ({v})")
        return Probe(Verdict.GOOD)


CPO_BAD = {"0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.16.1"}  # broken 0.14.0, fixed 0.17.0


def test_direction():
    assert direction("0.13.0", "0.16.1") is Direction.REGRESSION
    assert direction("0.19.0", "0.14.0") is Direction.FIX
    with pytest.raises(ValueError):
        direction("1.0", "1.0.0")


def test_first_bad():
    fake = Fake(bad=CPO_BAD)
    r = bisect(VERSIONS, "0.13.0", "0.16.1", fake)
    assert (r.mode, r.label, r.first, r.last_old, r.ambiguous) == (
        Direction.REGRESSION, "first bad", "0.14.0", "0.13.0", [])
    assert r.first_probe.headline.endswith("(0.14.0)")
    assert fake.calls[:2] == ["0.13.0", "0.16.1"]  # bounds first
    assert len(fake.calls) == len(set(fake.calls)) <= 2 + 3  # log2(5 between) ~ 3 probes


def test_first_fixed_with_bounds_the_other_way_round():
    fake = Fake(bad=CPO_BAD)
    r = bisect(VERSIONS, good="0.19.0", bad="0.14.0", probe=fake)
    assert (r.mode, r.label, r.first, r.last_old) == (Direction.FIX, "first fixed", "0.17.0", "0.16.1")
    assert r.probes["0.16.1"].verdict is Verdict.BAD


@pytest.mark.parametrize("culprit", range(1, len(VERSIONS)))
def test_every_position_is_found(culprit):
    bad = set(VERSIONS[culprit:])
    r = bisect(VERSIONS, VERSIONS[0], VERSIONS[-1], Fake(bad=bad))
    assert r.first == VERSIONS[culprit]


def test_versions_outside_the_bounds_are_not_probed():
    fake = Fake(bad=CPO_BAD)
    bisect(VERSIONS, "0.13.0", "0.16.1", fake)
    assert not set(fake.calls) & {"0.17.0", "0.18.0", "0.19.0"}


def test_skip_probes_a_neighbour_and_still_converges():
    # 0.15.1 cannot be installed; the middle pick lands on it first
    fake = Fake(bad={"0.16.0", "0.16.1"}, skip={"0.15.1"})
    r = bisect(VERSIONS, "0.13.0", "0.16.1", fake)
    assert fake.calls[2] == "0.15.1"
    assert r.first == "0.16.0" and r.last_old == "0.15.2"
    assert r.ambiguous == []
    assert "0.15.1" in fake.calls
    assert r.probes["0.15.1"].verdict is Verdict.SKIP


def test_skip_next_to_the_answer_is_ambiguous():
    fake = Fake(bad={"0.15.2", "0.16.0", "0.16.1"}, skip={"0.15.1", "0.15.0"})
    r = bisect(VERSIONS, "0.13.0", "0.16.1", fake)
    assert r.first == "0.15.2" and r.last_old == "0.14.0"
    assert r.ambiguous == ["0.15.0", "0.15.1"]


def test_all_skipped_between_bounds():
    fake = Fake(bad={"0.16.1"}, skip=set(VERSIONS[1:6]))
    r = bisect(VERSIONS, "0.13.0", "0.16.1", fake)
    assert r.first == "0.16.1" and r.ambiguous == VERSIONS[1:6]


def test_bounds_are_checked():
    with pytest.raises(BoundsError, match="0.13.0 was given as good but tested bad") as ei:
        bisect(VERSIONS, "0.13.0", "0.16.1", Fake(bad=set(VERSIONS)))
    assert ei.value.version == "0.13.0"
    with pytest.raises(BoundsError, match="0.16.1 was given as bad but tested good"):
        bisect(VERSIONS, "0.13.0", "0.16.1", Fake(bad=set()))
    with pytest.raises(BoundsError, match="could not be tested"):
        bisect(VERSIONS, "0.13.0", "0.16.1", Fake(bad=CPO_BAD, skip={"0.13.0"}))
    # in fix mode the older bound must be bad
    with pytest.raises(BoundsError, match="0.14.0 was given as bad but tested good"):
        bisect(VERSIONS, "0.19.0", "0.14.0", Fake(bad=set()))


def test_trusted_bounds_are_not_probed():
    fake = Fake(bad=CPO_BAD)
    r = bisect(VERSIONS, "0.13.0", "0.16.1", fake, check_bounds=False)
    assert r.first == "0.14.0"
    assert "0.13.0" not in fake.calls and "0.16.1" not in fake.calls


def test_on_step_reports_remaining():
    steps = []
    bisect(VERSIONS, "0.13.0", "0.16.1", Fake(bad=CPO_BAD), on_step=lambda n, s: steps.append((n, s)))
    assert steps[0] == (5, 3)
    assert [n for n, _ in steps] == sorted([n for n, _ in steps], reverse=True)


def test_unsorted_input_and_unknown_bound():
    r = bisect(list(reversed(VERSIONS)), "0.13.0", "0.16.1", Fake(bad=CPO_BAD))
    assert r.first == "0.14.0"
    with pytest.raises(ValueError, match="not in the version list"):
        bisect(VERSIONS, "0.12.0", "0.16.1", Fake())


def test_steps_left():
    assert [steps_left(n) for n in (0, 1, 2, 3, 4, 7, 8)] == [0, 1, 2, 2, 3, 3, 4]


def test_sweep_finds_a_one_release_regression():
    # a regression living in one release: a bisect between two good ends cannot see it
    fake = Fake(bad={"0.15.0"})
    swept = sweep(["0.16.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2"], fake)
    assert swept.versions == ["0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0"]
    assert fake.calls == swept.versions
    assert swept.bad == ["0.15.0"] and swept.bad_runs() == [["0.15.0"]]
    assert swept.good == ["0.14.0", "0.15.1", "0.15.2", "0.16.0"]


def test_sweep_runs_and_skips():
    fake = Fake(bad={"0.14.0", "0.15.0", "0.16.1"}, skip={"0.15.1"})
    swept = sweep(VERSIONS[:7], fake)
    assert swept.skipped == ["0.15.1"]
    assert swept.bad_runs() == [["0.14.0", "0.15.0"], ["0.16.1"]]
