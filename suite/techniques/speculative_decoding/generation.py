"""A generation run of speculative decoding, what both decoders share: the case's models and
prompts (:class:`SpecWorkload`, from :mod:`gpubench.models.decode_pair` and its held-out corpus),
the params' rules, the positions one sequence may reach, each prompt's sampling generator (the
same seed for both variants) and the drafter a prompt starts with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpubench.contract import Workload
from gpubench.errors import BadInput
from gpubench.lib.drafting import ModelDrafter, NgramDrafter
from gpubench.models.decode_pair import load_pair, pair_problems
from gpubench.models.llama import LlamaWeights

DTYPES = {"float32": torch.float32, "float64": torch.float64}
DRAFTERS = ("draft_model", "ngram")


def draft_spec(params: dict[str, Any]) -> str | None:
    return params["draft"] if params["drafter"] == "draft_model" else None


def spec_problems(params: dict[str, Any]) -> list[str]:
    """The cross-param rules: the n-gram range, and a target and draft that can be loaded as a pair."""
    problems = []
    if params["ngram_min"] > params["ngram_max"]:
        problems.append(f"ngram_min ({params['ngram_min']}) must not exceed ngram_max ({params['ngram_max']})")
    return problems + pair_problems(params["target"], draft_spec(params))


def capacity(params: dict[str, Any]) -> int:
    """Positions one sequence may reach: prompt, new tokens and the drafts of the last verification."""
    return params["prompt_len"] + params["max_new_tokens"] + 4 * params["k"] + 2


@dataclass(kw_only=True)
class SpecWorkload(Workload):
    target: LlamaWeights
    draft: LlamaWeights | None  # None for drafter ngram
    prompts: list[list[int]]
    # One plain decode step of the target (s), the unit of c and verify_cost: what plain's timed
    # calls measured, set by plain's metrics (the harness derives metrics baseline first).
    target_step_s: float | None = None


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> SpecWorkload:
    """The target and drafter of ``params`` on ``device``, and ``prompts`` prompts cut from the
    held-out corpus at seeded offsets."""
    problems = spec_problems(params)
    if problems:
        raise BadInput("speculative_decoding: " + "; ".join(problems))
    device = torch.device(device)
    pair = load_pair(params["target"], draft_spec(params), device, DTYPES[params["dtype"]])
    target, draft, source = pair.target, pair.draft, pair.held_out
    need = capacity(params)
    for name, model in (("target", target), ("draft", draft)):
        if model is not None and need > model.config.max_position:
            raise BadInput(
                f"prompt_len + max_new_tokens (+ drafts) = {need} tokens exceeds the {name}'s "
                f"{model.config.max_position} positions"
            )
    plen = params["prompt_len"]
    if len(source) <= plen:
        raise BadInput(f"prompt_len {plen} is longer than the held-out corpus ({len(source)} tokens)")
    offsets = torch.randint(
        0, len(source) - plen, (params["prompts"],), generator=torch.Generator().manual_seed(seed)
    ).tolist()
    return SpecWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        target=target,
        draft=draft,
        prompts=[source[o : o + plen].tolist() for o in offsets],
    )


def sampling_generator(w: SpecWorkload, i: int) -> torch.Generator | None:
    """Prompt i's sampling generator: the same seed for both variants (which use it differently)."""
    return w.generator(offset=7919 * (i + 1)) if w.params["temperature"] > 0 else None


def make_drafter(w: SpecWorkload) -> ModelDrafter | NgramDrafter:
    """A fresh drafter for one prompt: prompt lookup, or the draft model with its own KV cache."""
    p = w.params
    if p["drafter"] == "ngram":
        return NgramDrafter(p["ngram_max"], p["ngram_min"])
    assert w.draft is not None  # built where the drafter is a model
    return ModelDrafter(w.draft, capacity(p))
