"""The published figures the built-in training and decoding pairs are measured against, one table
(:class:`gpubench.claims.Claim` s, keyed by technique), so that every source a report cites is
read in one place. A technique declares ``claims=PUBLISHED["name"]``; the rule that reads a run
against them is :mod:`gpubench.claims`'s.
"""
from __future__ import annotations

from gpubench.claims import UNSLOTH_NVIDIA, Claim

LEVIATHAN = ("Leviathan et al. (ICML 2023)", "https://arxiv.org/abs/2211.17192")

PUBLISHED: dict[str, tuple[Claim, ...]] = {
    "activation_offload": (
        Claim(*UNSLOTH_NVIDIA, text="~8% faster per step with double-buffered reloads", figure=(1.08, 1.08),
              measures="training step time, two reload buffers (overlapped) vs one (waited for)",
              conditions="8B-14B models, offloaded gradient checkpointing, NVIDIA GPU over PCIe",
              when={"hidden": (">=", 2048)},
              caveat="our decoder: a few layers at that width, not a whole 8B-14B model",
              device_reason="the win is PCIe reloads overlapped with recompute on a copy stream; "
                            "a CPU has neither"),
    ),
    "packed_metadata": (
        Claim(*UNSLOTH_NVIDIA, text="+14.3% per training step (read as 1.143x)", figure=(1.143, 1.143),
              measures="training step time, packed metadata cached once vs rebuilt in every layer",
              conditions="Qwen3-14B (40 layers) QLoRA SFT on packed sequences, NVIDIA GPU",
              when={"model": ("in", ("100m", "1b"))},
              caveat="our decoder (seeded random weights, full training), not Qwen3-14B with QLoRA",
              device_reason="the win is the per-layer .item() host sync, which costs a CPU nothing"),
    ),
    "moe_grouping": (
        Claim(*UNSLOTH_NVIDIA, text="gpt-oss training +15% (read as 1.15x)", figure=(1.15, 1.15),
              measures="training step time, MoE routing by argsort + bincount vs a torch.where per expert",
              conditions="gpt-oss (20b: 32 experts, top-4, hidden 2880) fine-tuning, NVIDIA GPU",
              when={"experts": (">=", 32), "top_k": (">=", 4), "hidden": (">=", 2880)},
              caveat="the pair times one MoE layer's forward + backward, not the whole model's step, "
                     "where attention and the rest dilute the layer's gain",
              device_reason="the win is one host sync per expert, which costs a CPU nothing"),
    ),
    "speculative_decoding": (
        Claim(*LEVIATHAN, text="speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1)), from the measured a and c",
              figure=None, figure_metric="predicted_speedup", tolerance=0.10,
              measures="generation time, draft + verify vs plain decoding, against the formula's "
                       "prediction from this case's acceptance rate a and draft cost ratio c",
              conditions="verification of k + 1 tokens costs one target step (memory-bound decode)",
              device_reason="the formula assumes verifying k + 1 tokens costs one target step; on a CPU "
                            "compute grows with the tokens scored (see verify_cost)"),
        Claim(*LEVIATHAN, text="2-3x faster generation, identical outputs", figure=(2.0, 3.0),
              measures="generation time, draft + verify vs plain decoding",
              conditions="T5-XXL (11B) with a T5-small drafter on a TPU-v4, batch 1",
              caveat="our target and drafter are small models, not T5-XXL and T5-small",
              device_reason="verification is cheap only where decode is memory-bound"),
    ),
}
