"""The published figure combined_training is measured against (read against every run in the
report's "published claims on this device"; the rule is :mod:`gpubench.records.claims`'s)."""

from __future__ import annotations

from gpubench.records.claims import UNSLOTH_NVIDIA, Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        *UNSLOTH_NVIDIA,
        text="~25% faster training with all three optimizations (read as 1.25x)",
        figure=(1.25, 1.25),
        measures="training step time, packed-metadata caching + MoE argsort/bincount routing + double-buffered "
        "checkpoint reloads all on vs all off",
        conditions="Unsloth fine-tuning on NVIDIA GPUs from RTX laptops to DGX Spark, notably consumer RTX",
        caveat="our model is a small gpt-oss-style MoE decoder, not the models Unsloth trained",
        device_reason="the wins are host syncs and PCIe reloads overlapped on a copy stream, which a CPU has not",
    ),
)
