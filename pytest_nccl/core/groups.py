"""Process groups as the analysis names them: a label ("default", "tp[2,3]", "pg4[0-15]") carries the
group's ranks, so every rank's records name the same group the same way without any torch object.
Standard library only: every rank imports it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

DEFAULT = "default"  # the label of the world's own group (group=None, GroupMember.WORLD)


def rank_ranges(ranks) -> str:
    """'0-14,16' for ranks 0..14 and 16: runs of three or more as ranges."""
    ranks = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i:j + 1])
        i = j + 1
    return ",".join(parts)


def parse_ranges(text: str) -> list[int] | None:
    """The inverse of ``rank_ranges`` (also 'a-b:s' for a stride); None when it is not one."""
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, _, rest = part.partition("-")
                hi, _, step = rest.partition(":")
                out.extend(range(int(lo), int(hi) + 1, int(step) if step else 1))
            else:
                out.append(int(part))
    except ValueError:
        return None
    return out


MAX_LABEL_RANKS = 48  # characters of the ranks shown in a label; longer: "..." (members unknown)
_NAMELESS = ("", "undefined", "default_pg", "default")  # descriptions that name no group: c10d's name instead


def ranks_text(ranks: list[int]) -> str:
    """The ranks part of a label: '2,3', '0-15', '0-62:2' (a stride), '3,1,2' (group rank order
    when not sorted), cut to '0,1,...' past ``MAX_LABEL_RANKS`` characters."""
    if ranks == sorted(ranks):
        shown = rank_ranges(ranks)
        if len(shown) > MAX_LABEL_RANKS and len(ranks) > 2:
            step = ranks[1] - ranks[0]
            if step > 0 and all(b - a == step for a, b in zip(ranks, ranks[1:], strict=False)):
                shown = f"{ranks[0]}-{ranks[-1]}:{step}"
    else:
        shown = ",".join(map(str, ranks))  # new_group(sort_ranks=False): group rank order
    return shown if len(shown) <= MAX_LABEL_RANKS else shown[:MAX_LABEL_RANKS].rsplit(",", 1)[0] + ",..."


def clean_name(text: str) -> str:
    """A name as a label carries it: letters, digits and ``_.-:`` only."""
    return "".join(c for c in text if c.isalnum() or c in "_.-:")


def group_label(name: str, desc: str, ranks: list[int] | None) -> str:
    """A group's label from what c10d knows of it: the user's description ("tp", a DeviceMesh
    dimension without its "mesh_"), else the c10d name ("pg4"), with its global ranks. The tracer
    and the Flight Recorder's reader both name groups here, so a journal and a dump agree."""
    if desc.startswith("mesh_") and desc != "mesh_default":
        desc = desc[5:]
    desc = clean_name(desc)
    base = f"pg{name}" if desc in _NAMELESS else desc
    return base if ranks is None else f"{base}[{ranks_text(list(ranks))}]"


P2P = ":p2p"  # a group's point-to-point transfers, numbered apart from its collectives: "tp[2,3]:p2p"


@lru_cache(maxsize=4096)  # a job has a few labels, read on every record
def _parse(label: str) -> GroupId:
    p2p = label.endswith(P2P)
    body = label[:-len(P2P)] if p2p else label
    at = body.find("[")
    if at < 0 or not body.endswith("]"):
        return GroupId(body, None, p2p)
    return GroupId(body[:at], body[at + 1:-1], p2p)


@dataclass(frozen=True)
class GroupId:
    """A group label taken apart, once: ``name`` ("default", "tp", "pg4", "weights"), ``ranks`` (the text
    between the brackets as the tracer wrote it: "2,3", "0-62:2", "0,1,...", "0,+1"; None without
    brackets) and ``p2p`` (the group's point-to-point transfers rather than its collectives).
    ``label`` formats it back, the same string: journals and messages carry the label."""

    name: str
    ranks: str | None = None
    p2p: bool = False

    parse = staticmethod(_parse)  # GroupId.parse(label), cached

    @property
    def label(self) -> str:
        body = self.name if self.ranks is None else f"{self.name}[{self.ranks}]"
        return body + P2P if self.p2p else body

    def __str__(self) -> str:
        return self.label

    @property
    def collectives(self) -> GroupId:
        """The group itself ("tp[2,3]" of "tp[2,3]:p2p")."""
        return replace(self, p2p=False) if self.p2p else self

    @property
    def transfers(self) -> GroupId:
        """The group's point-to-point side ("tp[2,3]:p2p" of "tp[2,3]")."""
        return self if self.p2p else replace(self, p2p=True)

    @property
    def members(self) -> list[int] | None:
        """The ranks the label carries, in group rank order; None for the default group or a label
        without all of its ranks ("pg3[0,1,...]")."""
        inside = self.ranks
        if not inside or self.name == DEFAULT:
            return None
        if ",+" in inside:  # "weights[0,+1]": a side group; its other members are not ranks of this world
            inside = inside.split(",+", 1)[0]
        return parse_ranges(inside) if "..." not in inside else None

    def members_in(self, world: int) -> list[int]:
        """Ranks of the group in a world of ``world`` ranks, in group rank order (all of them when
        the label does not carry its ranks)."""
        ranks = self.members
        return [r for r in ranks if r < world] if ranks is not None else list(range(world))


def label_ranks(pg: str) -> list[int] | None:
    """The ranks of a group label ("tp[2,3]", "pg4[0-15]") in group rank order; None for the
    default group or a label without its ranks."""
    return GroupId.parse(pg).members


def members_of(pg: str, world: int) -> list[int]:
    """Ranks of a group, from its label ("default", "tp[2,3]", "pg1[0-15]"), in group rank order."""
    return GroupId.parse(pg).members_in(world)
