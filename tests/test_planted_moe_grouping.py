"""moe_grouping: a routing bug planted in the sort-and-group path fails the run's own check (output
and every gradient against the float64 dense reference) in at least two smoke-like cases, among
them two top_k > 1 cases of different shapes."""

from __future__ import annotations

import pytest
import torch
from planted import caught, passed, run_planted, shipped
from planted import mutant as _mutant

import gpubench.optimizations.moe_grouping as sort_group

# Smoke's shapes: gpt-oss-20b routing (32 experts, top-4) scaled down; a top-2 layer at odd sizes;
# top-1 in bf16.
TOP_4 = dict(experts=32, top_k=4, hidden=96, expert_dim=96, tokens=64, dtype="float32")
TOP_2 = dict(experts=6, top_k=2, hidden=48, expert_dim=40, tokens=77, dtype="float32")
TOP_1 = dict(experts=8, top_k=1, hidden=40, expert_dim=24, tokens=100, dtype="bfloat16")


def _assert_caught_only_with(monkeypatch, params: dict, name: str, buggy) -> None:
    """The case passes as shipped, and fails by its check on the optimized variant with ``buggy``
    in place of the sort-and-group module's ``name``."""
    assert passed(shipped("moe_grouping", **params))
    monkeypatch.setattr(sort_group, name, buggy)
    record = run_planted("moe_grouping", **params)
    assert caught(record), (record.status, record.failure)


def _route_without_renormalizing(x, router_weight, router_bias, top_k):
    """The top-k of a softmax over every expert (Qwen2-MoE's router with norm_topk_prob off), not
    gpt-oss's softmax over the top-k logits: a token's weights sum to less than 1."""
    probs = torch.nn.functional.linear(x, router_weight, router_bias).softmax(dim=-1)
    return torch.topk(probs, top_k, dim=-1)


@pytest.mark.parametrize("params", [TOP_4, TOP_2, TOP_1], ids=["top4", "top2", "top1-bf16"])
def test_routing_weights_not_renormalized_over_the_top_k_are_caught(monkeypatch, params):
    _assert_caught_only_with(monkeypatch, params, "route", _route_without_renormalizing)


@pytest.mark.parametrize("params", [TOP_4, TOP_2], ids=["top4", "top2"])
def test_slot_major_token_index_is_caught_in_two_top_k_cases(monkeypatch, params):
    """group_by_expert reads the flattened choices as (top_k, tokens), slot-major (as the where
    loop's mask lays them out), so a sorted row's token is ``order % tokens``: the right token
    when top_k is 1, so only top_k > 1 cases can catch it."""
    buggy = _mutant(
        sort_group.group_by_expert,
        'token=torch.div(order, experts.shape[1], rounding_mode="floor")',
        "token=order % experts.shape[0]",
    )
    _assert_caught_only_with(monkeypatch, params, "group_by_expert", buggy)


COUNTS = "counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))"


@pytest.mark.parametrize("tokens", [5, 9])
def test_counts_of_only_the_experts_hit_are_caught_where_an_expert_gets_no_token(monkeypatch, tokens):
    """Counts from torch.unique(..., return_counts=True) list only the experts that got a token:
    with an expert left out, every later expert's slice goes to the wrong expert's weights. Smoke's
    entry with 5 and 9 tokens routed top-2 over 16 experts reaches it (its other cases hit every
    expert, and pass with the bug)."""
    params = dict(experts=16, top_k=2, hidden=32, expert_dim=24, tokens=tokens, dtype="float32")
    control = run_planted("moe_grouping", **params)
    assert passed(control) and control.variants["sort_group"].metrics["experts_hit"] < 16
    buggy = _mutant(sort_group.group_by_expert, COUNTS, "counts = torch.unique(flat, return_counts=True)[1]")
    monkeypatch.setattr(sort_group, "group_by_expert", buggy)
    assert caught(run_planted("moe_grouping", **params))
    assert passed(run_planted("moe_grouping", **TOP_2))  # every expert hit: blind to it


def test_an_unstable_argsort_is_caught_by_ties_at_scale():
    """argsort without stable=True: the output and gradients stay right (index_add_ sums the same
    rows), so no run's check can see it; the grouping test with thousands of tied expert ids
    does, where the 10-row one passes."""
    from test_moe_grouping import assert_stable_grouping

    buggy = _mutant(sort_group.group_by_expert, "torch.argsort(flat, stable=True)", "torch.argsort(flat)")
    small = torch.tensor([[3, 0], [0, 5], [3, 5], [6, 0], [5, 3]])
    assert_stable_grouping(buggy(small, 8), small)  # the old test's 10 rows: blind to it
    experts = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(t))[:4] for t in range(4096)])
    with pytest.raises(AssertionError, match="not stable"):
        assert_stable_grouping(buggy(experts, 8), experts)
