"""Test outcomes and matrix cell states are enum members, never bare words; a results file with an
outcome this version does not know (a newer or foreign one) loads, renders and is written back as it was."""

import json

import pytest

from pytest_nccl.bisect.matrix.cells import NOT_RUN, CellStatus, cell, world_result
from pytest_nccl.bisect.matrix.render import render
from pytest_nccl.bisect.matrix.results import Results, Run, TestRecord
from pytest_nccl.core.states import CaseOutcome

NODE = "suites/trl/matrix/test_matrix.py::test_cell[sft-ragged]"
OTHER = "suites/trl/matrix/test_matrix.py::test_cell[dpo-even]"


def test_case_outcomes_read_their_words_and_say_what_callers_ask():
    assert [CaseOutcome.read(w) for w in ("passed", "error", "xpassed")] == \
        [CaseOutcome.PASSED, CaseOutcome.ERROR, CaseOutcome.XPASSED]
    assert CaseOutcome.read("rerun") is None and CaseOutcome.read(None) is None
    assert {o for o in CaseOutcome if o.failed} == {CaseOutcome.FAILED, CaseOutcome.ERROR}
    assert {o for o in CaseOutcome if o.ran_clean} == {CaseOutcome.PASSED, CaseOutcome.XFAILED, CaseOutcome.XPASSED}
    assert f"{CaseOutcome.XFAILED}" == "xfailed" and json.dumps(CaseOutcome.FAILED) == '"failed"'


def test_a_record_given_by_its_word_holds_the_member():
    assert TestRecord("failed", "x").outcome is CaseOutcome.FAILED
    with pytest.raises(ValueError):
        TestRecord("rerun")  # code gives members; only a file's words may be unknown (TestRecord.read)


def _file_with(outcome_word: str) -> str:
    r = Results("trl", ["suites/trl/matrix"])
    r.put(Run("1.0", 2, tests={NODE: TestRecord(CaseOutcome.PASSED), OTHER: TestRecord(CaseOutcome.FAILED, "boom")}))
    r.put(Run("1.1", 2, tests={NODE: TestRecord(CaseOutcome.PASSED), OTHER: TestRecord(CaseOutcome.PASSED)}))
    doc = json.loads(r.dumps())
    doc["runs"]["1.1"]["2"]["tests"][NODE] = {"outcome": outcome_word, "headline": "from a newer pytest-nccl"}
    return json.dumps(doc)


def test_an_unknown_outcome_loads_as_no_result_and_is_written_back_as_it_was():
    text = _file_with("rerun")
    r = Results.loads(text)
    rec = r.get("1.1", 2).tests[NODE]
    assert rec.outcome is None and rec.word == "rerun" and rec.headline == "from a newer pytest-nccl"
    assert world_result(r.get("1.1", 2), NODE) == (CellStatus.NONE, "from a newer pytest-nccl")
    c = cell(r, NODE, "1.1")
    assert c.status is CellStatus.NONE and c.text == NOT_RUN  # as a test with no result
    assert cell(r, NODE, "1.0").status is CellStatus.GREEN
    counts = r.get("1.1", 2).counts()
    assert sum(counts.values()) == 1 and counts[CaseOutcome.PASSED] == 1  # the unknown one is not counted
    page = render(r, date="2026-01-01")
    assert "| 1.0 | 1.1 |" in page and "red on 1.0" in page
    again = json.loads(Results.loads(r.dumps()).dumps())
    assert again["runs"]["1.1"]["2"]["tests"][NODE] == {"outcome": "rerun", "headline": "from a newer pytest-nccl"}
    assert again == json.loads(text)


def test_a_known_outcome_loads_as_its_member():
    r = Results.loads(_file_with("xfailed"))
    assert r.get("1.1", 2).tests[NODE].outcome is CaseOutcome.XFAILED
    assert r.get("1.0", 2).tests[OTHER].outcome is CaseOutcome.FAILED
    assert cell(r, OTHER, "1.0").status is CellStatus.RED and cell(r, NODE, "1.1").status is CellStatus.GREEN
