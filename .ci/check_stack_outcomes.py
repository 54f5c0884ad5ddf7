#!/usr/bin/env python3
"""Check a TRL or verl stack's JUnit XML against the documented outcome of every suites/trl (suites/verl) test.

    check_stack_outcomes.py STACK JUNIT.xml

STACK names a row of EXPECTED (e.g. "trl-0.15.0", "current"). A test listed for the stack must
fail with its documented exception (CollectiveMismatch unless the entry names another), the
diagnosis headline of the listed kind, and the report naming the TRL source file of the bug; every
other test must pass (skips are failures too, unless listed in SKIP_OK). Prints one line per test and exits 1 on
any surprise.
Standard library only: it runs under whatever Python runs .ci.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

# Documented regressions: test-id pattern -> (TRL file of the documented collective, headline
# regex). The headline regexes are the CollectiveMismatch kinds of pytest_nccl.core.diagnosis.
SHAPE = r"^shape mismatch in all_gather #\d+ "
ANY_MISMATCH = r"^((shape|dtype) mismatch in \w+ #\d+ |op mismatch at collective #\d+ )"
SFT_2879 = {"test_sft.py::test_sft_unpacked_ragged_lengths[*]": ("trl/trainer/sft_trainer.py", SHAPE)}
CPO_3068 = {
    "test_preference.py::test_preference_ragged_lengths[cpo]": ("trl/trainer/cpo_trainer.py", SHAPE),
    "test_preference.py::test_preference_ragged_lengths[simpo]": ("trl/trainer/cpo_trainer.py", SHAPE),
    "test_preference.py::test_preference_ragged_lengths[orpo]": ("trl/trainer/orpo_trainer.py", SHAPE),
}
# rank 1 skips the entropy gather and enters its next one: on gloo that is a dtype mismatch
# (rank 0's int64 length gather against rank 1's float32 metric gather) at the same seq
GRPO_4041 = {"test_grpo.py::test_grpo_entropy_mask_one_rank_empty": ("trl/trainer/grpo_trainer.py", ANY_MISMATCH)}
# every rank raises at its first generation: not a collective mismatch, a crash on every rank
ONLINE_DPO_3063 = {"test_online_dpo.py::test_online_dpo_generates_on_every_rank": (
    "trl/trainer/online_dpo_trainer.py", r"^ranks 0,1 raised AttributeError: 'DistributedDataParallel' object "
    r"has no attribute 'config'", "RankRaised")}

# verl#6176/#6178 (.ci/verl_stacks.sh, suites/verl): 0.7.1's actor skips the micro-batch count
# sync; the rank with one micro-batch reduces the metric while the other all-gathers for its second
# forward, in verl's dp_actor.py (named through transformers' model code)
VERL_6176 = {"test_dynamic_batching.py::test_actor_log_prob_ragged_micro_batch_counts": (
    "verl/workers/actor/dp_actor.py", r"^op mismatch at collective #\d+ of group default: rank \d all_reduce, "
    r"rank \d all_gather_single .*verl/workers/actor/dp_actor\.py:\d+")}

# stack -> tests that must fail with CollectiveMismatch there (all others must pass)
EXPECTED: dict[str, dict[str, tuple]] = {
    # online DPO: trl#3063 from 0.14.0 (0.13.0 good, bisected) to 0.16.1
    "trl-0.14.0": {**CPO_3068, **ONLINE_DPO_3063},  # SFT good (no token-accuracy gather yet), CPO/ORPO bad
    "trl-0.15.0": {**SFT_2879, **CPO_3068, **ONLINE_DPO_3063},  # both bugs
    "trl-0.15.1": {**CPO_3068, **ONLINE_DPO_3063},  # SFT fixed by #2890
    "trl-0.16.1": {**CPO_3068, **ONLINE_DPO_3063},  # last release with trl#3068 and trl#3063
    "trl-0.17.0": {},  # fixed by #3069
    # trl#4041, the entropy-mask early return: in 0.21.0 .. 0.23.0 (checked in the wheels); 0.23.1
    # gathers with pad_across_processes and has no early return
    "trl-0.23.0": {**GRPO_4041},
    "trl-0.23.1": {},
    "current": {},  # whatever the project venv has (a current release): everything passes
    "verl-0.7.0": {},  # reduces the count over the default group
    "verl-0.7.1": {**VERL_6176},  # #5051 made the sync conditional on a dp_group the actor never passes
    "verl-0.9.1": {},  # no legacy actor (removed in 0.8.0); no CPU platform: its own sync needs a GPU
}
# tests a stack may skip (a trainer or feature it does not have), as patterns
SKIP_OK: dict[str, list[str]] = {
    "trl-0.14.0": ["test_grpo.py::*"],
    "trl-0.15.0": ["test_grpo.py::*"],
    "trl-0.15.1": ["test_grpo.py::*"],
    "trl-0.16.1": ["test_grpo.py::*"],
    "trl-0.17.0": ["test_grpo.py::*"],
    "verl-0.9.1": ["test_dynamic_batching.py::*", "test_watch_verl.py::*"],
}
def _matches(test_id: str, pattern: str) -> bool:
    """Glob with ``*`` only (``[...]`` in a test id is literal, not a character class)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), test_id) is not None




def _short_id(testcase: ET.Element) -> str:
    module = (testcase.get("classname") or "").rsplit(".", 1)[-1]
    return f"{module}.py::{testcase.get('name')}"


def _outcome(testcase: ET.Element):
    for child in testcase:
        if child.tag in ("failure", "error"):
            return child.tag, child.get("message") or "", child.text or ""
        if child.tag == "skipped":
            return "skipped", child.get("message") or "", child.text or ""
    return "passed", "", ""


def _properties(testcase: ET.Element) -> dict[str, str]:
    return {p.get("name"): p.get("value") or "" for p in testcase.iter("property")}


def check(stack: str, junit: str) -> list[str]:
    if stack not in EXPECTED:
        return [f"unknown stack {stack!r}; known: {', '.join(EXPECTED)}"]
    expected = EXPECTED[stack]
    problems: list[str] = []
    seen_patterns: set[str] = set()
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    if not cases:
        return [f"{junit}: no test cases"]
    for tc in cases:
        tid = _short_id(tc)
        outcome, message, text = _outcome(tc)
        props = _properties(tc)
        pattern = next((p for p in expected if _matches(tid, p)), None)
        if pattern is not None:
            seen_patterns.add(pattern)
            site, kind, *rest = expected[pattern]
            want = rest[0] if rest else "CollectiveMismatch"
            headline = props.get("nccl_diagnosis") or message
            exc = props.get("nccl_exception")  # written by newer plugins; else judged by the headline
            ok = (outcome == "failure" and re.search(kind, headline) is not None
                  and (exc is None or exc == want) and site in text)
            verdict = "ok  " if ok else "FAIL"
            print(f"{verdict} {tid}: expected {want} at {site}; got {outcome}: {headline[:200]}")
            if not ok:
                problems.append(f"{tid}: expected a {want} ({kind!r} at {site}), "
                                f"got {outcome} ({exc}): {headline[:300]}")
        elif outcome == "skipped" and any(_matches(tid, p) for p in SKIP_OK.get(stack, [])):
            print(f"ok   {tid}: skipped ({message[:120]})")
        else:
            verdict = "ok  " if outcome == "passed" else "FAIL"
            print(f"{verdict} {tid}: expected pass; got {outcome}" + (f": {message[:200]}" if message else ""))
            if outcome != "passed":
                problems.append(f"{tid}: expected to pass, got {outcome}: {message[:300]}")
    for pattern in expected:
        if pattern not in seen_patterns:
            problems.append(f"{pattern}: expected a failure but no such test ran")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    problems = check(argv[1], argv[2])
    if problems:
        print(f"{argv[1]}: {len(problems)} unexpected outcome(s):")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"{argv[1]}: every test had its documented outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
