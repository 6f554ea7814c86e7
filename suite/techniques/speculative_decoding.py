"""speculative_decoding: plain decoding (one target forward pass per token) against draft-and-verify
(a drafter proposes k tokens, the target scores them all in one pass, rejection sampling keeps the
target's distribution), a generation run over a few prompts decoded one at a time.

Models: by default a real pair, two small byte-level decoders trained briefly and
deterministically on standard-library source text (:mod:`gpubench.models.train_small`, cached
after the first build); prompts are drawn at seeded offsets from the held-out tail of that text.
Local Hugging Face checkpoints can stand in for either model (``target`` / ``draft``), and
``draft: early:N`` drafts with the target's own first N layers. ``drafter: ngram`` drafts by
prompt lookup, with no model at all.

Checks: greedy output must equal plain decoding's token for token. Sampled outputs differ from
the baseline's by construction (the two consume random numbers differently); their distribution
is checked against the target's by a chi-square test in ``tests/test_speculative_decoding.py``,
and each run checks the lengths.

Metrics, as vLLM reports them: acceptance rate (accepted / drafted), mean accepted length
(tokens per verification, the resampled or bonus token included), per-position acceptance,
tokens/s; and the cost ratio c measured in the run (drafting seconds per drafted token over one
target decode step, timed beside it) with Leviathan et al.'s predicted speedup
(1 - a^(k+1)) / ((1 - a)(k c + 1)). That formula assumes scoring k + 1 tokens costs one decode
step (true of memory-bound decode on a GPU); ``verify_cost`` is what it measured here, and
``predicted_speedup_with_verify_cost`` puts it in place of the 1. The formula also assumes each
draft survives independently with probability a; ``iid_accepted_length`` is what that predicts per
verification beside the measured ``mean_accepted_length``, and
``predicted_speedup_from_accepted_length`` is the time model fed the measured length instead.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from gpubench.baselines.speculative_decoding import KVCache, generate
from gpubench.contract import CheckResult, Measured, Param, Technique, Workload
from gpubench.errors import BadInput
from gpubench.models import train_small
from gpubench.models.llama import LlamaWeights, load_hf
from gpubench.optimizations.speculative_decoding import ModelDrafter, NgramDrafter, SpecStats, speculative_generate

DTYPES = {"float32": torch.float32, "float64": torch.float64}
TRAINED = "trained"
DRAFTERS = ("draft_model", "ngram")

TECHNIQUE = Technique(
    name="speculative_decoding",
    shape="generation_run",
    summary="A drafter proposes k tokens and the target scores them all in one forward pass; rejection "
            "sampling keeps the target's distribution exactly (greedy: identical tokens)",
    anchor="Leviathan et al. (ICML 2023): 2-3x faster T5-XXL generation, identical outputs; "
           "speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1))",
    gpu_specific=(
        "The win rests on verification being cheap: on a GPU, decode is memory-bound, so the target "
        "scores k + 1 tokens in about the time of one decode step (the weights are read once either way) "
        "and Leviathan's formula applies with a verification cost of 1. On a CPU, compute grows with the "
        "tokens scored, so verifying k + 1 tokens costs more than a step (see verify_cost) and the "
        "drafter's c is a different ratio too (per-operation overhead dominates these small models on "
        "both, but not in the same proportion). The CPU ratio is a real measurement of this machine, "
        "not a prediction of a GPU's."
    ),
    headline="predicted_speedup",
    params=[
        Param("drafter", str, "draft_model", "who proposes: a small draft model, or prompt lookup (n-gram) "
              "in the context, no model", choices=list(DRAFTERS)),
        Param("k", int, 4, "draft tokens per verification (the start value when adaptive)", min=1, max=16),
        Param("adaptive_k", bool, False, "k grows by one after a verification that accepted every draft and "
              "shrinks by one after one that rejected any (between 1 and 2k)"),
        Param("temperature", float, 0.0, "0: greedy, checked token for token against plain decoding; "
              "> 0: sampled from softmax(logits / T)", min=0.0),
        Param("prompts", int, 2, "prompts, each decoded alone (batch 1)", min=1),
        Param("prompt_len", int, 64, "tokens per prompt, from the held-out corpus at seeded offsets", min=2),
        Param("max_new_tokens", int, 64, "tokens generated per prompt", min=1),
        Param("target", str, TRAINED, "'trained' (the default pair's target) or a local Hugging Face "
              "Llama-style checkpoint directory"),
        Param("draft", str, TRAINED, "drafter draft_model only: 'trained' (the default pair's draft), "
              "'early:N' (the target's first N layers with its head), or a local checkpoint directory"),
        Param("ngram_max", int, 3, "drafter ngram: longest suffix looked up", min=1),
        Param("ngram_min", int, 1, "drafter ngram: shortest suffix looked up", min=1),
        Param("dtype", str, "float32", "weights and activations (greedy compares exactly)", choices=list(DTYPES)),
    ],
)


def _early_layers(spec: str) -> int | None:
    if not spec.startswith("early:"):
        return None
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        return -1


def _hf_layers(path: str) -> int | None:
    try:
        return int(json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    problems = []
    if params["ngram_min"] > params["ngram_max"]:
        problems.append(f"ngram_min ({params['ngram_min']}) must not exceed ngram_max ({params['ngram_max']})")
    target = params["target"]
    if target != TRAINED and not (Path(target) / "config.json").is_file():
        problems.append(f"target {target!r} is neither 'trained' nor a checkpoint directory holding config.json")
    if params["drafter"] == "draft_model":
        draft = params["draft"]
        early = _early_layers(draft)
        if early is not None:
            layers = train_small.TARGET_CONFIG.num_layers if target == TRAINED else _hf_layers(target)
            if early < 1 or (layers is not None and early >= layers):
                problems.append(f"draft {draft!r}: N must be a whole number from 1 to the target's layers - 1"
                                + (f" ({layers - 1})" if layers else ""))
        elif draft == TRAINED:
            if target != TRAINED:
                problems.append("draft 'trained' pairs only with target 'trained' (they share the byte "
                                "vocabulary); give a draft checkpoint or early:N for a checkpoint target")
        elif not (Path(draft) / "config.json").is_file():
            problems.append(f"draft {draft!r} is neither 'trained', 'early:N' nor a checkpoint directory "
                            "holding config.json")
    return problems


# -- workload ---------------------------------------------------------------------------------

def _moved(weights: LlamaWeights, device: torch.device, dtype: torch.dtype) -> LlamaWeights:
    """A copy of ``weights`` on ``device`` in ``dtype`` (a fresh RoPE cache)."""
    move = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    layers = [replace(layer, **{n: move(getattr(layer, n)) for n in layer.__dataclass_fields__})
              for layer in weights.layers]
    embed = move(weights.embed)
    lm_head = embed if weights.lm_head is weights.embed else move(weights.lm_head)
    return LlamaWeights(weights.config, embed, layers, move(weights.final_norm), lm_head, source=weights.source)


def early_layers(weights: LlamaWeights, n: int) -> LlamaWeights:
    """The target's first ``n`` layers with its embedding, final norm and head: a draft that costs
    n / layers of the target per token and needs no training (and agrees with it far less)."""
    return LlamaWeights(replace(weights.config, num_layers=n), weights.embed, weights.layers[:n],
                        weights.final_norm, weights.lm_head, source=f"first {n} layers of {weights.source}")


def _checkpoint_tokens(path: str, vocab: int) -> torch.Tensor:
    """The held-out corpus text in a checkpoint's own tokens (its tokenizer, read locally), or as
    bytes when it has no tokenizer and a vocabulary of at least 256."""
    text = bytes(train_small.split_corpus(train_small.corpus_bytes())[1].tolist()).decode("utf-8", "ignore")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception:  # noqa: BLE001 - no tokenizer there: bytes, if the vocabulary holds them
        if vocab < 256:
            raise BadInput(f"{path}: no tokenizer could be read there and the vocabulary ({vocab}) is too small "
                           "for byte tokens; add the tokenizer files to the checkpoint directory") from None
        ids = list(text.encode("utf-8"))
    return torch.tensor(ids, dtype=torch.long)


def _warm_up(weights: LlamaWeights) -> None:
    """One small forward pass, so lazy initialization is not charged to the first checked call."""
    with torch.inference_mode():
        KVCache(weights, 8).forward(list(range(4)))


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    problems = validate(params)
    if problems:
        raise BadInput("speculative_decoding: " + "; ".join(problems))
    device = torch.device(device)
    dtype = DTYPES[params["dtype"]]
    info: dict[str, Any] = {}
    if params["target"] == TRAINED or (params["drafter"] == "draft_model" and params["draft"] == TRAINED):
        pair = train_small.trained_pair()
        info = pair.info
    if params["target"] == TRAINED:
        target = _moved(pair.target, device, dtype)
        source = pair.held_out
    else:
        target = load_hf(params["target"], dtype, device)
        source = _checkpoint_tokens(params["target"], target.config.vocab_size)
    draft = None
    if params["drafter"] == "draft_model":
        spec = params["draft"]
        if spec == TRAINED:
            draft = _moved(pair.draft, device, dtype)
        elif _early_layers(spec) is not None:
            draft = early_layers(target, _early_layers(spec))
        else:
            draft = load_hf(spec, dtype, device)
            if draft.config.vocab_size != target.config.vocab_size:
                raise BadInput(f"draft {spec}: vocabulary of {draft.config.vocab_size} tokens differs from the "
                               f"target's {target.config.vocab_size}; a draft must share the target's tokenizer")
        _warm_up(draft)
    _warm_up(target)
    need = params["prompt_len"] + params["max_new_tokens"] + 4 * params["k"] + 2
    for name, model in (("target", target), ("draft", draft)):
        if model is not None and need > model.config.max_position:
            raise BadInput(f"prompt_len + max_new_tokens (+ drafts) = {need} tokens exceeds the {name}'s "
                           f"{model.config.max_position} positions")
    plen = params["prompt_len"]
    if len(source) <= plen:
        raise BadInput(f"prompt_len {plen} is longer than the held-out corpus ({len(source)} tokens)")
    workload = Workload(params=dict(params), device=device, seed=seed)
    offsets = torch.randint(0, len(source) - plen, (params["prompts"],), generator=workload.generator()).tolist()
    workload.inputs.update(target=target, draft=draft, prompts=[source[o:o + plen].tolist() for o in offsets],
                           pair_info=info, vocab=target.config.vocab_size)
    return workload


def _generator(w: Workload, i: int) -> torch.Generator | None:
    """Prompt i's sampling generator: the same seed for both variants (which use it differently)."""
    return w.generator(offset=7919 * (i + 1)) if w.params["temperature"] > 0 else None


# -- variants ---------------------------------------------------------------------------------

@TECHNIQUE.variant("baseline", role="baseline")
def run_baseline(w: Workload) -> dict[str, Any]:
    """Plain decoding: one target forward pass per token, a KV cache for the past."""
    tokens, forwards = [], 0
    for i, prompt in enumerate(w.prompts):
        out, info = generate(w.target, prompt, w.params["max_new_tokens"], w.params["temperature"], _generator(w, i))
        tokens.append(out)
        forwards += info["target_forwards"]
    return {"tokens": tokens, "temperature": w.params["temperature"], "target_forwards": forwards}


def make_drafter(w: Workload):
    p = w.params
    if p["drafter"] == "ngram":
        return NgramDrafter(p["ngram_max"], p["ngram_min"])
    return ModelDrafter(w.draft, p["prompt_len"] + p["max_new_tokens"] + 4 * p["k"] + 2)


@TECHNIQUE.variant("optimized", role="optimized")
def run_speculative(w: Workload) -> dict[str, Any]:
    """Speculative decoding: the drafter proposes k tokens, the target verifies them in one pass;
    accepted by rejection sampling (greedy: while argmaxes agree); both KV caches rolled back."""
    p = w.params
    tokens, total = [], SpecStats()
    for i, prompt in enumerate(w.prompts):
        out, stats = speculative_generate(w.target, make_drafter(w), prompt, p["max_new_tokens"], p["k"],
                                          p["adaptive_k"], p["temperature"], _generator(w, i))
        tokens.append(out)
        total.add(stats)
    return {"tokens": tokens, "temperature": p["temperature"], "stats": total.to_dict(),
            "target_forwards": total.verifications + sum(len(pr) > 1 for pr in w.prompts)}


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.check
def check(ref: dict[str, Any], out: dict[str, Any]) -> CheckResult:
    """Greedy: every prompt's tokens equal plain decoding's, position by position (the error is the
    number of mismatched tokens, a missing or extra token counting as one). Sampled: the two differ
    by construction, so each sequence is checked for its length only (the distribution is tested
    by the chi-square test of the test suite)."""
    if len(ref["tokens"]) != len(out["tokens"]):
        return CheckResult(False, None, None, "mismatched_tokens",
                           f"{len(out['tokens'])} sequences, expected {len(ref['tokens'])}")
    if ref["temperature"] > 0:
        bad = [i for i, (r, o) in enumerate(zip(ref["tokens"], out["tokens"])) if len(r) != len(o)]
        return CheckResult(not bad, float(len(bad)), None, "wrong_length_sequences",
                           f"sequences {bad} have the wrong length" if bad else
                           "sampled: outputs differ by construction; lengths checked (the distribution is "
                           "tested against the target's by chi-square in the test suite)")
    mismatched, first = 0, None
    for i, (r, o) in enumerate(zip(ref["tokens"], out["tokens"])):
        diff = [j for j, (a, b) in enumerate(zip(r, o)) if a != b]
        mismatched += len(diff) + abs(len(r) - len(o))
        if first is None and (diff or len(r) != len(o)):
            j = diff[0] if diff else min(len(r), len(o))
            first = f"prompt {i} first differs at token {j} of {len(r)}"
    return CheckResult(mismatched == 0, float(mismatched), None, "mismatched_tokens", first or "")


# -- metrics ----------------------------------------------------------------------------------

def expected_tokens(a: float, k: float) -> float:
    """Tokens one verification yields when each of k drafts survives independently with
    probability a: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: float, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al.'s expected walltime improvement, (1 - a^(k+1)) / ((1 - a)(k c + 1)); with
    ``verify_cost`` (a verification's time in target decode steps) in place of the 1."""
    return expected_tokens(a, k) / (k * c + verify_cost)


def target_step_seconds(w: Workload, reps: int = 3) -> float:
    """One plain decode step of the target as the baseline takes it (forward, cache write, pick),
    the unit c and verify_cost are counted in: the time of generating 1 + n tokens less that of
    generating 1 (the prefill), over n; median of ``reps``. Measured once per workload, after
    the timed calls."""
    cached = w.inputs.get("_target_step_s")
    if cached is not None:
        return cached
    prompt, n = w.prompts[0], max(1, min(32, w.params["max_new_tokens"]))

    def seconds(new: int) -> float:
        t0 = time.perf_counter()
        generate(w.target, prompt, new)
        return time.perf_counter() - t0

    seconds(1 + n)  # warm
    short = statistics.median(seconds(1) for _ in range(reps))
    long = statistics.median(seconds(1 + n) for _ in range(reps))
    w.inputs["_target_step_s"] = max(long - short, 1e-9) / n
    return w.inputs["_target_step_s"]


@TECHNIQUE.metrics
def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    p = w.params
    new_tokens = p["prompts"] * p["max_new_tokens"]
    out = measured.output
    m: dict[str, Any] = {"tokens_per_s": new_tokens / measured.median_s,
                         "target_forwards_per_token": out["target_forwards"] / new_tokens}
    m["target_params"] = w.target.config.num_params()
    if w.draft is not None:
        m["draft_params"] = w.draft.config.num_params()
    stats = out.get("stats")
    if stats is None:  # the baseline: plain decoding is its own 1x
        m["predicted_speedup"] = 1.0
        return m
    step = target_step_seconds(w)
    drafted, verifications = stats["drafted"], stats["verifications"]
    a = stats["accepted"] / drafted if drafted else None
    k_mean = drafted / verifications
    c = stats["draft_s"] / drafted / step if drafted else None
    verify_cost = stats["verify_s"] / verifications / step
    m.update({
        "acceptance_rate": a,
        "mean_accepted_length": stats["emitted"] / verifications,
        "per_position_acceptance": [acc / n if n else None for acc, n in zip(stats["accepted_at"], stats["drafted_at"])],
        "drafted_tokens": drafted, "accepted_tokens": stats["accepted"], "verifications": verifications,
        "k_mean": k_mean,
        "c": c,
        "verify_cost": verify_cost,
        "target_step_s": step,
        "draft_time_fraction": stats["draft_s"] / (stats["draft_s"] + stats["verify_s"]),
    })
    if a is not None:
        m["iid_accepted_length"] = expected_tokens(a, k_mean)
        m["predicted_speedup"] = predicted_speedup(a, k_mean, c)
        m["predicted_speedup_with_verify_cost"] = predicted_speedup(a, k_mean, c, verify_cost)
        # The same time model fed the measured tokens per verification instead of the iid estimate
        # from a: where acceptances come in streaks (they do in text), this is the one that holds.
        m["predicted_speedup_from_accepted_length"] = m["mean_accepted_length"] / (k_mean * c + verify_cost)
    else:  # nothing was drafted (prompt lookup found no match): plain decoding through the verifier
        m["predicted_speedup"] = 1.0
        m["predicted_speedup_with_verify_cost"] = 1.0 / verify_cost
    return m


# -- report -----------------------------------------------------------------------------------

def _label(params: dict[str, Any], varying: list[str]) -> str:
    parts = [params.get("drafter", "?")]
    parts += [f"{k}={params.get(k)}" for k in varying]
    return ", ".join(parts)


def _lines(cases: list[dict[str, Any]], read: Callable[[dict[str, Any], str, str], Any]
           ) -> dict[str, list[tuple[int, Any]]]:
    """label -> [(k, value)] over the cases; ``read(case, baseline_name, optimized_name)``. Cases
    that differ in anything but k (and the drafter, always in the label) get separate lines."""
    keyed = [c for c in cases if isinstance((c.get("params") or {}).get("k"), int)]
    names = sorted({n for c in keyed for n in c["params"]} - {"k", "drafter"})
    varying = [n for n in names if len({repr(c["params"].get(n)) for c in keyed}) > 1]
    out: dict[str, list[tuple[int, Any]]] = {}
    for case in keyed:
        roles = {v.get("role"): n for n, v in (case.get("variants") or {}).items()}
        if "baseline" not in roles or "optimized" not in roles:
            continue
        value = read(case, roles["baseline"], roles["optimized"])
        if value is not None:
            out.setdefault(_label(case["params"], varying), []).append((case["params"]["k"], value))
    for points in out.values():
        points.sort(key=lambda kv: kv[0])
    return out


def _metric(case: dict[str, Any], name: str, key: str) -> float | None:
    value = ((case["variants"].get(name) or {}).get("metrics") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@TECHNIQUE.figures
def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Per drafter, against k: measured speedup (95% CI) beside Leviathan's predicted one (and the
    prediction with the measured verification cost); acceptance rate and mean accepted length;
    tokens/s of both variants. Figures without data are left out."""
    from matplotlib.figure import Figure

    out = []
    measured = _lines(cases, lambda c, b, o: (c.get("speedups") or {}).get(o))
    measured = {k: [(x, s) for x, s in v if isinstance(s, dict) and s.get("ratio") is not None]
                for k, v in measured.items()}
    predicted = _lines(cases, lambda c, b, o: _metric(c, o, "predicted_speedup"))
    with_verify = _lines(cases, lambda c, b, o: _metric(c, o, "predicted_speedup_with_verify_cost"))
    if any(measured.values()) or predicted:
        fig = Figure(figsize=(7, 3.4))
        ax = fig.add_subplot()
        for i, label in enumerate(sorted(set(measured) | set(predicted))):
            color = f"C{i}"
            pts = measured.get(label) or []
            if pts:
                ks = [x for x, _ in pts]
                ratio = [s["ratio"] for _, s in pts]
                err = [[r - (s.get("ci_low") or r) for r, (_, s) in zip(ratio, pts)],
                       [(s.get("ci_high") or r) - r for r, (_, s) in zip(ratio, pts)]]
                ax.errorbar(ks, ratio, yerr=err, marker="o", color=color, capsize=3, label=f"{label}: measured")
            if predicted.get(label):
                ax.plot(*zip(*predicted[label]), marker="s", linestyle="--", color=color,
                        label=f"{label}: predicted (Leviathan)")
            if with_verify.get(label):
                ax.plot(*zip(*with_verify[label]), marker="^", linestyle=":", color=color,
                        label=f"{label}: predicted, measured verify cost")
        ax.axhline(1.0, color="#888888", linewidth=0.8)
        ax.set_xlabel("k (draft tokens per verification)")
        ax.set_ylabel("speedup over plain decoding")
        ax.legend(fontsize=6)
        fig.tight_layout()
        out.append(("Measured vs predicted speedup against k, per drafter", fig))
    rate = _lines(cases, lambda c, b, o: _metric(c, o, "acceptance_rate"))
    length = _lines(cases, lambda c, b, o: _metric(c, o, "mean_accepted_length"))
    if rate or length:
        fig = Figure(figsize=(7, 3.0))
        ax1, ax2 = fig.subplots(1, 2)
        for i, label in enumerate(sorted(set(rate) | set(length))):
            if rate.get(label):
                ax1.plot(*zip(*rate[label]), marker="o", color=f"C{i}", label=label)
            if length.get(label):
                ax2.plot(*zip(*length[label]), marker="o", color=f"C{i}", label=label)
        ax1.set_xlabel("k")
        ax1.set_ylabel("acceptance rate")
        ax2.set_xlabel("k")
        ax2.set_ylabel("tokens per verification")
        ax1.legend(fontsize=6)
        fig.tight_layout()
        out.append(("Acceptance rate and mean accepted length against k, per drafter", fig))
    tps_opt = _lines(cases, lambda c, b, o: _metric(c, o, "tokens_per_s"))
    tps_base = _lines(cases, lambda c, b, o: _metric(c, b, "tokens_per_s"))
    if tps_opt:
        fig = Figure(figsize=(7, 3.2))
        ax = fig.add_subplot()
        for i, label in enumerate(sorted(tps_opt)):
            ax.plot(*zip(*tps_opt[label]), marker="o", color=f"C{i}", label=f"{label}: speculative")
            if tps_base.get(label):
                ax.plot(*zip(*tps_base[label]), marker="x", linestyle="--", color=f"C{i}",
                        label=f"{label}: plain decoding")
        ax.set_xlabel("k (draft tokens per verification)")
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=6)
        fig.tight_layout()
        out.append(("Tokens/s against k, per drafter", fig))
    return out
