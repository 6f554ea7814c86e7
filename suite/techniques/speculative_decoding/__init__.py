"""speculative_decoding: plain decoding (``plain``, one target forward pass per token) against
draft-and-verify (``draft_verify``), a generation run over a few prompts decoded one at a time.
Models: the default trained pair (:mod:`gpubench.models.train_small`), local Hugging Face
checkpoints, or the target's first N layers as the draft; ``drafter: ngram`` needs no draft model.
Greedy runs are checked token for token against plain decoding, sampled runs by a distribution test
of the acceptance rule at the run's own verifications; both replay draft_verify's verifications and
its drafter's final state against a cacheless recomputation (:mod:`gpubench.techniques.speculative_decoding.run_check`).
"""

from __future__ import annotations

from gpubench.baselines.speculative_decoding import generate
from gpubench.contract import Bench, Headline, Param, Plot, Recorder, Technique
from gpubench.lib.drafting import Verification
from gpubench.measure.phase_timer import PhaseTimer
from gpubench.models.decode_pair import TRAINED
from gpubench.optimizations import speculative_decoding as spec
from gpubench.optimizations.speculative_decoding import SpecStats, speculative_generate
from gpubench.techniques.speculative_decoding import run_check as speculative_check
from gpubench.techniques.speculative_decoding.claims import CLAIMS
from gpubench.techniques.speculative_decoding.figures import generation_metrics
from gpubench.techniques.speculative_decoding.generation import (
    DRAFTERS,
    DTYPES,
    SpecWorkload,
    build_workload,
    make_drafter,
    sampling_generator,
    spec_problems,
)
from gpubench.techniques.speculative_decoding.run_check import Decoded, Generation, Replay

TECHNIQUE = Technique(
    name="speculative_decoding",
    shape="generation_run",
    summary="A drafter proposes k tokens and the target scores them all in one forward pass; rejection "
    "sampling keeps the target's distribution exactly (greedy: identical tokens)",
    anchor="Leviathan et al. (ICML 2023): 2-3x faster T5-XXL generation, identical outputs; "
    "speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1))",
    claims=CLAIMS,
    gpu_specific=(
        "The win rests on verification being cheap: on a GPU, decode is memory-bound, so the target "
        "scores k + 1 tokens in about the time of one decode step (the weights are read once either way) "
        "and Leviathan's formula applies with a verification cost of 1. On a CPU, compute grows with the "
        "tokens scored, so verifying k + 1 tokens costs more than a step (see verify_cost) and the "
        "drafter's c is a different ratio too (per-operation overhead dominates these small models on "
        "both, but not in the same proportion). The CPU ratio is a real measurement of this machine, "
        "not a prediction of a GPU's."
    ),
    headline_figures=(Headline("predicted_speedup", "predicted speedup", replaces_time=False),),
    benchmarks=[
        Bench(drafter, {"drafter": drafter, "prompts": 1, "max_new_tokens": 48}) for drafter in ("draft_model", "ngram")
    ],
    # Lines against k; the drafter (and adaptive_k, temperature) label the lines where they vary.
    plots=[
        Plot(
            "Measured and predicted speedup against k",
            x="k",
            variants=("optimized",),
            y=("speedup", "predicted_speedup", "predicted_speedup_with_verify_cost"),
            ylabel="speedup over plain decoding",
        ),
        Plot(
            "Acceptance rate against k",
            y="acceptance_rate",
            x="k",
            variants=("optimized",),
            ylabel="accepted / drafted",
        ),
        Plot(
            "Mean accepted length against k",
            y="mean_accepted_length",
            x="k",
            variants=("optimized",),
            ylabel="tokens per verification",
        ),
        Plot("Tokens/s against k", y="tokens_per_s", x="k", ylabel="tokens/s"),
    ],
    params=[
        Param(
            "drafter",
            str,
            "draft_model",
            "who proposes: a small draft model, or prompt lookup (n-gram) in the context, no model",
            choices=list(DRAFTERS),
        ),
        Param("k", int, 4, "draft tokens per verification (the start value when adaptive)", min=1, max=16),
        Param(
            "adaptive_k",
            bool,
            False,
            "k grows by one after a verification that accepted every draft and "
            "shrinks by one after one that rejected any (between 1 and 2k)",
        ),
        Param(
            "temperature",
            float,
            0.0,
            "0: greedy, checked token for token against plain decoding; > 0: sampled from softmax(logits / T)",
            min=0.0,
        ),
        Param("prompts", int, 2, "prompts, each decoded alone (batch 1)", min=1),
        Param("prompt_len", int, 64, "tokens per prompt, from the held-out corpus at seeded offsets", min=2),
        Param("max_new_tokens", int, 64, "tokens generated per prompt", min=1),
        Param(
            "target",
            str,
            TRAINED,
            "'trained' (the default pair's target) or a local Hugging Face Llama-style checkpoint directory",
        ),
        Param(
            "draft",
            str,
            TRAINED,
            "drafter draft_model only: 'trained' (the default pair's draft), "
            "'early:N' (the target's first N layers with its head), or a local checkpoint directory",
        ),
        Param("ngram_max", int, 3, "drafter ngram: longest suffix looked up", min=1),
        Param("ngram_min", int, 1, "drafter ngram: shortest suffix looked up", min=1),
        Param("dtype", str, "float32", "weights and activations (greedy compares exactly)", choices=list(DTYPES)),
    ],
)


validate = TECHNIQUE.validate(spec_problems)
build = TECHNIQUE.build(build_workload)


@TECHNIQUE.variant("plain", role="baseline")
def plain(w: SpecWorkload, rec: Recorder) -> Decoded:
    """one target forward pass per token, a KV cache for the past"""
    tokens, forwards, timer = [], 0, PhaseTimer(w.device)
    for i, prompt in enumerate(w.prompts):
        out, n = generate(
            w.target, prompt, w.params["max_new_tokens"], w.params["temperature"], sampling_generator(w, i), timer
        )
        tokens.append(out)
        forwards += n
    # the one-token steps after each prompt's prefill: a plain decode step of the target
    steps = len(w.prompts) * (w.params["max_new_tokens"] - 1)
    rec.record(target_forwards=forwards, decode_s=timer.seconds.get("decode", 0.0), decode_steps=steps)
    return Decoded(tokens, w.params["temperature"])


@TECHNIQUE.variant("draft_verify", role="optimized")
def draft_verify(w: SpecWorkload, rec: Recorder) -> Decoded:
    """the drafter proposes k tokens, the target verifies them in one forward pass (rejection
    sampling; greedy: argmax agreement); both KV caches rolled back"""
    p = w.params
    tokens, total, generations = [], SpecStats(), []
    for i, prompt in enumerate(w.prompts):
        drafter, steps = make_drafter(w), list[Verification]()
        out, stats = speculative_generate(
            w.target,
            drafter,
            prompt,
            p["max_new_tokens"],
            p["k"],
            p["adaptive_k"],
            p["temperature"],
            sampling_generator(w, i),
            trace=steps,
        )
        tokens.append(out)
        total.add(stats)
        generations.append(Generation(list(prompt), steps, drafter))
    rec.record(
        drafted=total.drafted,
        accepted=total.accepted,
        verifications=total.verifications,
        emitted=total.emitted,
        target_forwards=total.target_forwards,
        draft_s=total.draft_s,
        verify_s=total.verify_s,
        accepted_at=list(total.accepted_at),
        drafted_at=list(total.drafted_at),
    )
    replay = Replay(generations, w.target, w.draft, (p["ngram_max"], p["ngram_min"]), spec.verify, w.seed)
    return Decoded(tokens, p["temperature"], replay)


check = TECHNIQUE.check(speculative_check.check)
metrics = TECHNIQUE.metrics(generation_metrics)
