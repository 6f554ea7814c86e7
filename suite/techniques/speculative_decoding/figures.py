"""The figures of a speculative decoding run, derived from what its timed calls recorded:
acceptance, tokens per verification, the draft's cost c and a verification's cost in plain decode
steps of the target, and Leviathan et al.'s predicted speedup from them (pure functions; nothing
here runs a model).
"""

from __future__ import annotations

from typing import Any

from gpubench.contract import Measured
from gpubench.techniques.speculative_decoding.generation import SpecWorkload


def expected_tokens(a: float, k: float) -> float:
    """Tokens per verification when each of k drafts survives independently with probability a:
    (1 - a^(k+1)) / (1 - a)."""
    return k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: float, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al.'s (1 - a^(k+1)) / ((1 - a)(k c + 1)), with ``verify_cost`` (a verification
    in target decode steps) in place of the 1."""
    return expected_tokens(a, k) / (k * c + verify_cost)


def target_step_seconds(w: SpecWorkload, measured: Measured) -> float | None:
    """One plain decode step of the target (forward, cache write, pick): plain's decode phase over
    its steps, median over its timed calls; kept on the workload for draft_verify's metrics."""
    steps, decode_s = measured.median_of("decode_steps"), measured.median_of("decode_s")
    if measured.variant == "plain" and steps and decode_s is not None:  # (plain records both every call)
        w.target_step_s = max(decode_s, 1e-9) / steps
    return w.target_step_s


def _summed(records: list[dict[str, Any]], key: str) -> list[int]:
    """Element-wise sum of a list recorded by every call."""
    out: list[int] = []
    for r in records:
        out += [0] * (len(r[key]) - len(out))
        for i, v in enumerate(r[key]):
            out[i] += v
    return out


def generation_metrics(w: SpecWorkload, measured: Measured) -> dict[str, Any]:
    """Tokens/s and model sizes; from the records, target forwards per token and, for a drafting
    variant once plain's step time is known, acceptance, c, verify_cost and the predicted speedups."""
    new_tokens = w.params["prompts"] * w.params["max_new_tokens"]
    m: dict[str, Any] = {"tokens_per_s": new_tokens / measured.median_s, "target_params": w.target.config.num_params()}
    if w.draft is not None:
        m["draft_params"] = w.draft.config.num_params()
    records = measured.records
    if not records:
        return m
    # Counts: summed over the timed calls (rates are ratios of the sums; per-call figures divide
    # by the calls). Times (draft_s, verify_s): medians over the timed calls.
    calls = len(records)
    total = {key: sum(r[key] for r in records) for key in records[0] if not isinstance(records[0][key], list)}
    m["target_forwards_per_token"] = total["target_forwards"] / (calls * new_tokens)
    step = target_step_seconds(w, measured)
    if "drafted" not in total:  # plain decoding: its own 1x
        m["predicted_speedup"] = 1.0
        return m
    if step is None:  # plain was not measured: nothing to express draft and verify costs in
        return m
    drafted, verifications = total["drafted"], total["verifications"]
    a = total["accepted"] / drafted if drafted else None
    k_mean = drafted / verifications
    draft_s, verify_s = measured.median_of("draft_s"), measured.median_of("verify_s")
    if draft_s is None or verify_s is None:  # (draft_verify records both every call: never so)
        return m
    c = draft_s / (drafted / calls) / step if drafted else None
    verify_cost = verify_s / (verifications / calls) / step
    m.update(
        {
            "acceptance_rate": a,
            "mean_accepted_length": total["emitted"] / verifications,
            "per_position_acceptance": [
                acc / n if n else None
                for acc, n in zip(_summed(records, "accepted_at"), _summed(records, "drafted_at"))
            ],
            "drafted_tokens": drafted / calls,
            "accepted_tokens": total["accepted"] / calls,
            "verifications": verifications / calls,
            "k_mean": k_mean,
            "c": c,
            "verify_cost": verify_cost,
            "target_step_s": step,
            "draft_time_fraction": draft_s / (draft_s + verify_s),
        }
    )
    if a is not None and c is not None:  # (both None where nothing was drafted)
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
