"""The diagnosis: per-rank records and outcomes -> the first divergence, the kind of failure and a
one-line headline (``classify.diagnose``). Pure: tested on hand-written data.

- ``findings``: the types (``Divergence``, ``Diagnosis``);
- ``divergence``: where the ranks' sequences part, and what gloo said of it;
- ``deadlock``: transfers that can never pair, groups blocked on each other;
- ``pairing``: transfers that paired with a tensor of another shape or dtype (crossed pairs);
- ``wording``: how ranks, positions and durations read;
- ``classify``: the order the patterns are tried in, and each headline.
"""

from .classify import diagnose
from .divergence import first_divergence
from .findings import Diagnosis, Divergence

__all__ = ["Diagnosis", "Divergence", "diagnose", "first_divergence"]
