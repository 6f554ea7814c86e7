"""Query and key/value heads of the attention techniques (grouped-query attention): the params a
scenario sets, the rule they must meet, and the kv head count they mean."""
from __future__ import annotations

from typing import Any

from gpubench.contract import Param


def head_params(heads: int) -> list[Param]:
    """``heads`` (default ``heads``) and ``kv_heads`` (0: as many as heads)."""
    return [Param("heads", int, heads, "query heads", min=1),
            Param("kv_heads", int, 0, "key/value heads (GQA); 0 means the same as heads", min=0)]


def kv_heads(params: dict[str, Any]) -> int:
    return params["kv_heads"] or params["heads"]


def head_problems(params: dict[str, Any]) -> list[str]:
    heads, kv = params["heads"], kv_heads(params)
    return [] if heads % kv == 0 else [f"heads ({heads}) must be divisible by kv_heads ({kv})"]
