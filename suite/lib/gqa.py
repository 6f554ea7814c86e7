"""Query and key/value heads of the attention techniques (grouped-query attention): the params a
scenario sets, the rules they must meet, and the kv head count they mean."""

from __future__ import annotations

from typing import Any

from gpubench.contract import Param


def head_params(heads: int) -> list[Param]:
    """``heads`` (default ``heads``) and ``kv_heads`` (0: as many as heads)."""
    return [
        Param("heads", int, heads, "query heads", min=1),
        Param("kv_heads", int, 0, "key/value heads (GQA); 0 means the same as heads", min=0),
    ]


def kv_heads(params: dict[str, Any]) -> int:
    return params["kv_heads"] or params["heads"]


def head_problems(params: dict[str, Any]) -> list[str]:
    heads, kv = params["heads"], kv_heads(params)
    return [] if heads % kv == 0 else [f"heads ({heads}) must be divisible by kv_heads ({kv})"]


def decoder_head_dim(params: dict[str, Any]) -> int:
    """A decoder's head_dim: ``head_dim`` when set (real models differ: Qwen3-0.6B has hidden 1024,
    16 heads of 128), else hidden / heads."""
    return params.get("head_dim", 0) or params["hidden"] // params["heads"]


def decoder_head_problems(params: dict[str, Any]) -> list[str]:
    """The head rules of a decoder built from ``hidden``, ``heads``, ``kv_heads`` (all given) and
    an optional ``head_dim`` (0 or absent: hidden / heads, which must then divide evenly): heads
    of an even head_dim (RoPE rotates pairs of channels), heads into groups of kv_heads."""
    problems = []
    if params.get("head_dim", 0):
        if params["head_dim"] % 2:
            problems.append(f"head_dim {params['head_dim']} must be even (RoPE rotates pairs of channels)")
    elif params["hidden"] % params["heads"]:
        problems.append(f"hidden {params['hidden']} is not a multiple of heads {params['heads']} (or set head_dim)")
    elif (params["hidden"] // params["heads"]) % 2:
        problems.append(f"head_dim {params['hidden'] // params['heads']} (hidden / heads) must be even")
    if params["heads"] % params["kv_heads"]:
        problems.append(f"heads {params['heads']} is not a multiple of kv_heads {params['kv_heads']}")
    return problems
