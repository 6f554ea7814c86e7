"""The published figures moe_grouping is measured against (read against every run in the report's
"published claims on this device"; the rule is :mod:`gpubench.records.claims`'s)."""

from __future__ import annotations

from gpubench.records.claims import UNSLOTH_NVIDIA, Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        *UNSLOTH_NVIDIA,
        text="gpt-oss training +15% (read as 1.15x)",
        figure=(1.15, 1.15),
        measures="training step time, MoE routing by argsort + bincount vs a torch.where per expert",
        conditions="gpt-oss (20b: 32 experts, top-4, hidden 2880) fine-tuning, NVIDIA GPU",
        when={"experts": (">=", 32), "top_k": (">=", 4), "hidden": (">=", 2880)},
        caveat="the pair times one MoE layer's forward + backward, not the whole model's step, "
        "where attention and the rest dilute the layer's gain",
        device_reason="the win is one host sync per expert, which costs a CPU nothing",
    ),
)
