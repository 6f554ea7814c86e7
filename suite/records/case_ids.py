"""Reading a case id back: ``technique[k=v,k=v,...]`` (built by the scenario's ``Case.id``)."""

from __future__ import annotations

import re

# A value may hold commas itself (ignore_fields=a,b), so the pairs are split only at a comma that
# starts the next ``name=``.
_PAIR_SPLIT = re.compile(r",(?=[A-Za-z_][A-Za-z0-9_]*=)")


def id_pairs(inner: str) -> list[str]:
    """The ``k=v`` pieces of a case id's bracket (without the brackets), a value's own commas kept."""
    return [piece for piece in _PAIR_SPLIT.split(inner) if piece]
