"""The published figures activation_offload is measured against (read against every run in the report's
"published claims on this device"; the rule is :mod:`gpubench.records.claims`'s)."""

from __future__ import annotations

from gpubench.records.claims import UNSLOTH_NVIDIA, Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        *UNSLOTH_NVIDIA,
        text="~8% faster per step with double-buffered reloads",
        figure=(1.08, 1.08),
        measures="training step time, two reload buffers (overlapped) vs one (waited for)",
        conditions="8B-14B models, offloaded gradient checkpointing, NVIDIA GPU over PCIe",
        when={"hidden": (">=", 2048)},
        caveat="our decoder: a few layers at that width, not a whole 8B-14B model",
        device_reason="the win is PCIe reloads overlapped with recompute on a copy stream; a CPU has neither",
    ),
)
