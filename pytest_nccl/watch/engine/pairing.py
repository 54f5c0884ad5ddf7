"""Controller side of ``pytest-nccl watch``: crossed point-to-point pairs said while the job runs
(``core.diagnosis.pairing``). A crossed pair often ends nothing (the bytes match, the tensors are
wrong), so it is a line, once per pair of ranks, and the job goes on.

The local ranks' journals are read a second time, by their own offsets, for their transfers' lines
only: the window's reader keeps no transfer arguments, and the collective path pays nothing.
"""

from __future__ import annotations

from ...core.diagnosis.pairing import PairingFollower, pairing_headline
from ...core.journal import transfers_entered
from .follow import JournalFile


class CrossedPairs:
    """One attempt's transfers, paired as its local ranks journal them."""

    def __init__(self):
        self.files: dict[int, JournalFile] = {}
        self.rest: dict[int, bytes] = {}     # rank -> a line cut at the end of the last read
        self.follower = PairingFollower()
        self.said: set[tuple] = set()        # (group, sender, receiver) whose crossing was said

    def lines(self, ranks: dict) -> list[str]:
        """A line for each pair of ranks whose transfers crossed since the last call and was not said
        yet, from what the ranks (rank -> ``follow.Followed``) journaled; another node's ranks are
        not read (their journals are there)."""
        found = []
        for rank, followed in sorted(ranks.items()):
            if not isinstance(followed.file, JournalFile):
                continue
            f = self.files.get(rank)
            if f is None:
                f = self.files[rank] = JournalFile(followed.file.path)
            data = f.read()
            if f.truncated:  # a restarted rank: its transfers start again
                f.truncated, self.rest[rank] = False, b""
            data = self.rest.get(rank, b"") + data
            cut = data.rfind(b"\n") + 1
            self.rest[rank] = data[cut:]
            for rec in transfers_entered(data[:cut], rank):
                found.extend(self.follower.add(rank, rec))
        out = []
        for crossing in found:
            key = (crossing.pg, crossing.send.rank, crossing.recv.rank)
            if key not in self.said:
                self.said.add(key)
                out.append(f"{pairing_headline([crossing])}; the job goes on (its tensors are wrong)")
        return out

    def close(self) -> None:
        for f in self.files.values():
            f.close()
