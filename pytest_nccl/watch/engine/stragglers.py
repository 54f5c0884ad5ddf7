"""Controller side of ``pytest-nccl watch``: at the end of a job, the stragglers its journals show
(``core.stragglers``): read once, after the ranks are gone, so the collective path pays nothing.

Each rank's journal is read as the job left it: the last two segments (``journal-R.txt.1`` and
``journal-R.txt``, ``agent.rotate``), so in a long job the figures cover its last collectives.
"""

from __future__ import annotations

from ...core import jobdir
from ...core.journal import parse_journal
from ...core.stragglers import Straggler, stragglers


def _journal_text(directory: str, rank: int) -> str:
    path = jobdir.journal(directory, rank)
    parts = []
    for name in (path + ".1", path):
        try:
            with open(name, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if text and not text.endswith("\n"):
            text = text[:text.rfind("\n") + 1]  # a torn last line
        parts.append(text)
    return "".join(parts)


def of_job(directory: str, ranks) -> list[Straggler]:
    """The stragglers of the ranks ``ranks`` of the attempt in ``directory``; [] when none (or on any
    error: this is a remark, never a reason to fail the watch)."""
    try:
        records = {r: parse_journal(_journal_text(directory, r), r) for r in sorted(ranks)}
        world = len(records)
        # the default group has every rank; a side group, the ranks that journaled it
        return stragglers(records, members={"default": world})
    except Exception:
        return []


def lines(found: list[Straggler]) -> list[str]:
    return [f"straggler: {s.line()}" for s in found]


def with_stragglers(summary: str, found: list[Straggler]) -> str:
    """The ``--json`` document with ``stragglers``: one item per group that has one (group, rank,
    last, compared, waited_s); [] when the ranks were even."""
    import json

    data = json.loads(summary)
    data["stragglers"] = [s.to_json() for s in found]
    return json.dumps(data, indent=1)
