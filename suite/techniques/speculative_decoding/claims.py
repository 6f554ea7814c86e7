"""The published figures speculative_decoding is measured against (read against every run in the report's
"published claims on this device"; the rule is :mod:`gpubench.records.claims`'s)."""

from __future__ import annotations

from gpubench.records.claims import Claim

LEVIATHAN = ("Leviathan et al. (ICML 2023)", "https://arxiv.org/abs/2211.17192")

CLAIMS: tuple[Claim, ...] = (
    Claim(
        *LEVIATHAN,
        text="speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1)), from the measured a and c",
        figure=None,
        figure_metric="predicted_speedup",
        tolerance=0.10,
        measures="generation time, draft + verify vs plain decoding, against the formula's "
        "prediction from this case's acceptance rate a and draft cost ratio c",
        conditions="verification of k + 1 tokens costs one target step (memory-bound decode)",
        device_reason="the formula assumes verifying k + 1 tokens costs one target step; on a CPU "
        "compute grows with the tokens scored (see verify_cost)",
    ),
    Claim(
        *LEVIATHAN,
        text="2-3x faster generation, identical outputs",
        figure=(2.0, 3.0),
        measures="generation time, draft + verify vs plain decoding",
        conditions="T5-XXL (11B) with a T5-small drafter on a TPU-v4, batch 1",
        caveat="our target and drafter are small models, not T5-XXL and T5-small",
        device_reason="verification is cheap only where decode is memory-bound",
    ),
)
