"""Process groups as the analysis names them: a label ("default", "tp[2,3]", "pg4[0-15]") carries the
group's ranks, so every rank's records name the same group the same way without any torch object.
Standard library only: every rank imports it."""

from __future__ import annotations


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


def label_ranks(pg: str) -> list[int] | None:
    """The ranks of a group label ("tp[2,3]", "pg4[0-15]") in group rank order; None for the
    default group or a label without its ranks."""
    if "[" not in pg or "]" not in pg:
        return None
    inside = pg[pg.find("[") + 1: pg.find("]")]
    if ",+" in inside:  # "weights[0,+1]": a side group; its other members are not ranks of this world
        inside = inside.split(",+", 1)[0]
    return parse_ranges(inside) if inside and "..." not in inside else None


def members_of(pg: str, world: int) -> list[int]:
    """Ranks of a group, from its label ("default", "tp[2,3]", "pg1[0-15]"), in group rank order."""
    ranks = label_ranks(pg) if pg != "default" else None
    return [r for r in ranks if r < world] if ranks is not None else list(range(world))


def group_base(pg: str) -> str:
    """The name of a label without its ranks: "tp[2,3]" -> "tp" (a mesh dimension, any of its groups)."""
    return pg.split("[", 1)[0].removesuffix(":p2p")
