"""The published figures packed_metadata is measured against (read against every run in the report's
"published claims on this device"; the rule is :mod:`gpubench.records.claims`'s)."""

from __future__ import annotations

from gpubench.records.claims import UNSLOTH_NVIDIA, Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        *UNSLOTH_NVIDIA,
        text="+14.3% per training step (read as 1.143x)",
        figure=(1.143, 1.143),
        measures="training step time, packed metadata cached once vs rebuilt in every layer",
        conditions="Qwen3-14B (40 layers) QLoRA SFT on packed sequences, NVIDIA GPU",
        when={"model": ("in", ("100m", "1b"))},
        caveat="our decoder (seeded random weights, full training), not Qwen3-14B with QLoRA",
        device_reason="the win is the per-layer .item() host sync, which costs a CPU nothing",
    ),
)
