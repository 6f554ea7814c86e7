"""Published claims a technique is measured against, and the verdict a run supports on each.

A technique declares its claims (``Technique(..., claims=[Claim(...)])``): the source, the figure
as published, what it measures, the conditions it was measured under, and how to find the
comparable figure in a run (the optimized speedup, or a variant's metric) and which cases are
comparable (device type, GPU family, param thresholds). :func:`read_case` turns one case record
(a results.json case) into a :class:`Reading`; :func:`verdict` is the rule, a pure function of the
measured CI and the claimed band:

- *falls short*: the CI's upper end is below the claimed figure less the tolerance;
- *exceeds*: the CI's lower end is above the claimed figure plus the tolerance;
- *holds*: the measured median lies within the claimed figure +- the tolerance;
- *inconclusive*: anything else (the CI reaches into the band but the median does not, or the
  CI is wider than the band on both sides): the run cannot support a verdict;
- *not comparable*: the case is not what the claim measured (a CPU where the claim is about a
  GPU's syncs or memory traffic, another GPU, other sizes), with the reason.
- *unverified*: the figure rests on fewer samples than a CI needs
  (:data:`gpubench.records.stats.MIN_CI_SAMPLES`; "too few samples (n=1)"): shown, never judged.

A bound (``at_most``: vLLM's KV waste under 4%) holds when the whole CI is within it, falls short
when the whole CI is beyond it; it has no "exceeds".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("holds", "falls short", "exceeds", "inconclusive", "not comparable", "unverified")
MIN_CI_SAMPLES = 5  # gpubench.records.stats.MIN_CI_SAMPLES (numpy is imported only where a CI is computed)
UNITS = ("speedup", "fraction", "tflops")
BOUNDS = ("value", "at_most", "at_least")
_OPS = {
    ">=": lambda v, x: v >= x,
    "<=": lambda v, x: v <= x,
    "==": lambda v, x: v == x,
    "!=": lambda v, x: v != x,
    "in": lambda v, x: v in x,
}


@dataclass(frozen=True)
class Claim:
    """One published figure, in a form a run can be read against.

    ``figure`` is ``(low, high)`` in ``unit`` (a single figure: low == high): a ``speedup`` is
    baseline time / optimized time (+14.3% per step is 1.143), a ``fraction`` is shown as a
    percentage (KV wasted 0.04), ``tflops`` is TFLOP/s. ``figure_metric`` instead takes the claimed
    figure from each case (a metric of the optimized variant: Leviathan's predicted speedup from
    the measured acceptance rate). ``reads`` is where the comparable figure is: ``speedup`` (the
    optimized variant's speedup over the baseline with its bootstrap CI) or a metric of the
    ``variant`` role; ``complement`` reads 1 - metric (waste from utilization); ``per_time`` says
    the metric is a count divided by the median time (TFLOP/s), so its CI follows the time's; a
    metric that is neither recorded per call nor per time is taken as exact (bookkeeping).

    Which cases are comparable: ``device_type`` (``cuda``, or empty for any device: a claim about
    bookkeeping), ``gpus`` (substrings of the GPU's name, any when empty) and ``when`` (param ->
    (operator, value[, why it matters]), operators ``>= <= == != in``; a param a case lacks (results
    written before the param existed) passes only an ``in`` whose values list None). ``caveat`` says what still differs
    when a case is comparable (our model is not theirs); ``device_reason`` why a CPU cannot check
    it; ``not_measured`` why the pair never measures what the claim does (it stays listed)."""

    source: str  # who published it, e.g. "Unsloth (2025)"
    url: str
    text: str  # the claim as published: "+14.3% per training step"
    figure: tuple[float, float] | None  # (low, high) in unit; None when figure_metric gives it
    unit: str = "speedup"
    measures: str = ""  # what the figure measures
    conditions: str = ""  # model, GPU, sizes, dtype of the published measurement
    bound: str = "value"
    reads: str = "speedup"
    variant: str = "optimized"  # the role whose metric is read (reads != "speedup")
    complement: bool = False
    per_time: bool = False
    figure_metric: str = ""
    device_type: str = "cuda"
    gpus: tuple[str, ...] = ()
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    tolerance: float = 0.05  # relative, around the claimed figure
    caveat: str = ""
    device_reason: str = ""
    not_measured: str = ""  # non-empty: why no case of this pair measures what the claim does

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"Claim {self.text!r}: unit must be one of {UNITS}")
        if self.bound not in BOUNDS:
            raise ValueError(f"Claim {self.text!r}: bound must be one of {BOUNDS}")
        if (self.figure is None) == (not self.figure_metric):
            raise ValueError(f"Claim {self.text!r}: give either figure=(low, high) or figure_metric")
        if self.figure is not None and not (len(self.figure) == 2 and 0 <= self.figure[0] <= self.figure[1]):
            raise ValueError(f"Claim {self.text!r}: figure must be (low, high) with 0 <= low <= high")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"Claim {self.text!r}: tolerance must be in [0, 1)")
        bad = [k for k, (op, *_) in self.when.items() if op not in _OPS]
        if bad:
            raise ValueError(f"Claim {self.text!r}: when {bad}: operators are {list(_OPS)}")

    def to_dict(self) -> dict[str, Any]:
        """The claim as results.json holds it (every field: a run is judged by the claims of its day)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Claim:
        """The claim a run recorded (``to_dict``); keys this version does not know are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        for key in ("figure", "gpus"):  # JSON has lists where the claim had tuples
            if isinstance(fields.get(key), list):
                fields[key] = tuple(fields[key])
        if isinstance(fields.get("when"), Mapping):
            fields["when"] = {
                k: tuple(tuple(x) if isinstance(x, list) else x for x in v) for k, v in fields["when"].items()
            }
        return cls(**fields)

    @property
    def figure_text(self) -> str:
        """The claimed figure in the unit the run's figure is shown in."""
        if self.figure is None:
            return f"the case's {self.figure_metric}"
        low, high = self.figure
        text = format_value(low, self.unit)
        if high != low:
            text += f"–{format_value(high, self.unit)}"
        return {"at_most": "≤ ", "at_least": "≥ "}.get(self.bound, "") + text


@dataclass
class Reading:
    """One case read against one claim."""

    case_id: str
    verdict: str
    reason: str = ""
    value: float | None = None  # the comparable figure
    low: float | None = None  # its 95% CI (equal to value when exact)
    high: float | None = None
    claimed: tuple[float, float] | None = None  # the band it was judged against (before tolerance)
    n: int | None = None  # the samples the figure rests on, where they are too few for a CI (unverified)

    @property
    def comparable(self) -> bool:
        return self.verdict != "not comparable"


def format_value(value: float, unit: str) -> str:
    if unit == "fraction":
        return f"{value * 100:.3g}%"
    if unit == "tflops":
        return f"{value:.4g} TFLOP/s"
    return f"{value:.4g}x"


def verdict(
    low: float, value: float, high: float, claimed: tuple[float, float], bound: str = "value", tolerance: float = 0.05
) -> tuple[str, str]:
    """The verdict a measured median ``value`` with 95% CI [``low``, ``high``] supports on the
    claimed band ``(claimed_low, claimed_high)`` widened by ``tolerance`` (relative), and why."""
    band_low, band_high = claimed[0] * (1 - tolerance), claimed[1] * (1 + tolerance)
    if bound == "at_most":
        if high <= band_high:
            return "holds", "the whole CI is within the bound"
        if low > band_high:
            return "falls short", "the whole CI is beyond the bound"
        return "inconclusive", "the CI straddles the bound"
    if bound == "at_least":
        if low >= band_low:
            return "holds", "the whole CI is within the bound"
        if high < band_low:
            return "falls short", "the whole CI is below the bound"
        return "inconclusive", "the CI straddles the bound"
    if high < band_low:
        return "falls short", "the CI's upper end is below the claim"
    if low > band_high:
        return "exceeds", "the CI's lower end is above the claim"
    if low < band_low and high > band_high:
        return "inconclusive", "the CI is wider than the claim's band on both sides"
    if band_low <= value <= band_high:
        return "holds", "the median is within the claim"
    return "inconclusive", "the CI reaches the claim but the median does not"


def _variant(case: Mapping[str, Any], role: str) -> tuple[str | None, dict[str, Any]]:
    for name, record in (case.get("variants") or {}).items():
        if record.get("role") == role:
            return name, record
    return None, {}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _param_problem(claim: Claim, params: Mapping[str, Any]) -> str | None:
    for name, (op, wanted, *why) in claim.when.items():
        have = params.get(name)
        try:
            ok = _OPS[op](have, wanted) if have is not None else op == "in" and None in wanted
        except TypeError:
            ok = False
        if not ok:
            shown = " or ".join(map(str, wanted)) if op == "in" else f"{op} {wanted}"
            have = repr(have) if isinstance(have, str) else have
            what = "other model" if name == "model" else "other sizes"
            return f"{what}: {name}={have} ({why[0] if why else f'the claim: {name} {shown}'})"
    return None


def comparability(claim: Claim, case: Mapping[str, Any], run_device: str = "") -> str | None:
    """Why ``case`` cannot be read against ``claim`` (None when it can)."""
    if claim.not_measured:
        return claim.not_measured
    if case.get("status") != "passed":
        return f"the case {case.get('status', 'did not pass')}"
    device = case.get("device") or {}
    kind = device.get("type") or (run_device.split(":")[0] if run_device else "")
    if claim.device_type and kind != claim.device_type:
        what = "a CPU" if kind == "cpu" else (kind or "an unknown device")
        return f"measured on {what}" + (f": {claim.device_reason}" if claim.device_reason else "")
    label = str(device.get("label") or "")
    if claim.gpus and not any(g.lower() in label.lower() for g in claim.gpus):
        return f"other GPU: {label or 'unknown'} (the claim: {' or '.join(claim.gpus)})"
    return _param_problem(claim, case.get("params") or {})


@dataclass(frozen=True)
class _Unverified:
    """A comparable figure with no CI to judge it by (:func:`_measured`): ``n`` samples, too few."""

    value: float
    n: int | None

    @property
    def reason(self) -> str:
        if self.n is None or self.n >= MIN_CI_SAMPLES:
            return "no CI recorded"
        return f"too few samples (n={self.n}; a CI needs {MIN_CI_SAMPLES})"


def _fewest_timed(case: Mapping[str, Any]) -> int | None:
    counts = [len(_variant(case, role)[1].get("samples_s") or []) for role in ("baseline", "optimized")]
    return min(counts) if all(counts) else None


def _measured(claim: Claim, case: Mapping[str, Any]) -> tuple[float, float, float] | _Unverified | str:
    """(low, value, high) of the comparable figure; :class:`_Unverified` where it has no CI (it
    rests on fewer than MIN_CI_SAMPLES samples: no verdict); or why it is missing."""
    if claim.reads == "speedup":
        name, _ = _variant(case, "optimized")
        ratio = (case.get("speedups") or {}).get(name) or {}
        value, low, high = (_number(ratio.get(k)) for k in ("ratio", "ci_low", "ci_high"))
        if value is None:
            return "no speedup recorded"
        n = ratio.get("n") if isinstance(ratio.get("n"), int) else _fewest_timed(case)
        if low is None or high is None or (n is not None and n < MIN_CI_SAMPLES):
            return _Unverified(value, n)
        return low, value, high
    _, record = _variant(case, claim.variant)
    value = _number((record.get("metrics") or {}).get(claim.reads))
    if value is None:
        return f"{claim.variant} recorded no {claim.reads}"
    low = high = value
    read = (_number(r.get(claim.reads)) for r in record.get("recorded") or [])
    per_call = [v for v in read if v is not None]
    stats = record.get("stats") or {}
    if len(per_call) >= 2 and len(set(per_call)) > 1 and len(per_call) < MIN_CI_SAMPLES:
        return _Unverified(value, len(per_call))  # it varies from call to call, over too few calls for a CI
    if len(per_call) == 1:
        return _Unverified(value, 1)  # one call cannot say whether the figure varies from call to call
    if len(per_call) >= 2:  # (the same figure every call: a count, exact; its CI has no width)
        from gpubench.records import stats as _stats  # numpy only when a claim reads per-call records

        summary = _stats.summarize(per_call)
        low, high = summary.bounds() if summary.has_interval else (value, value)
    elif claim.per_time:
        median, t_low, t_high = (_number(stats.get(k)) for k in ("median", "ci_low", "ci_high"))
        n = stats.get("n")
        if median and isinstance(n, int) and n < MIN_CI_SAMPLES:
            return _Unverified(value, n)
        if not median or not t_low or not t_high:
            return f"{claim.variant} has no timing CI to carry to {claim.reads}"
        low, high = value * median / t_high, value * median / t_low
    if claim.complement:
        low, value, high = 1 - high, 1 - value, 1 - low
    return low, value, high


def read_case(claim: Claim, case: Mapping[str, Any], run_device: str = "") -> Reading:
    """One case against one claim: its comparable figure with the CI and the verdict."""
    case_id = str(case.get("id", "?"))
    why = comparability(claim, case, run_device)
    if why is not None:
        return Reading(case_id, "not comparable", why)
    measured = _measured(claim, case)
    if isinstance(measured, str):
        return Reading(case_id, "not comparable", measured)
    if isinstance(measured, _Unverified):
        value = 1 - measured.value if claim.complement and claim.reads != "speedup" else measured.value
        return Reading(case_id, "unverified", measured.reason, value, None, None, claim.figure, n=measured.n)
    low, value, high = measured
    claimed = claim.figure
    if claimed is None:
        _, record = _variant(case, "optimized")
        figure = _number((record.get("metrics") or {}).get(claim.figure_metric))
        if figure is None:
            return Reading(case_id, "not comparable", f"the case recorded no {claim.figure_metric}")
        claimed = (figure, figure)
    result, why = verdict(low, value, high, claimed, claim.bound, claim.tolerance)
    return Reading(case_id, result, why, value, low, high, claimed)


def read_cases(claim: Claim, cases: Sequence[Mapping[str, Any]], run_device: str = "") -> list[Reading]:
    return [read_case(claim, case, run_device) for case in cases]


# Sources cited by several techniques.
UNSLOTH_NVIDIA = ("Unsloth with NVIDIA (2026)", "https://unsloth.ai/blog/nvidia-collab")
VLLM = ("Kwon et al., vLLM (SOSP 2023)", "https://arxiv.org/abs/2309.06180")


def vllm_kv_waste(reads: str) -> Claim:
    """vLLM's KV waste under 4%, read as 1 - the paged variant's ``reads`` (a KV utilization):
    bookkeeping, so any device gives a verdict."""
    return Claim(
        *VLLM,
        text="under 4% of KV memory wasted with paged blocks",
        figure=(0.04, 0.04),
        unit="fraction",
        bound="at_most",
        reads=reads,
        complement=True,
        device_type="",
        measures="KV memory reserved but not holding tokens, share of the reserved bytes",
        conditions="OPT-13B serving the ShareGPT trace on an A100, 16-token blocks (the paper's §6.2)",
        when={
            "block_size": ("<=", 16),
            "max_len": (
                ">=",
                512,
                "ShareGPT's conversations run to hundreds of tokens, and a sequence wastes up to a block at any length",
            ),
        },
        caveat="lengths here are this case's, not ShareGPT's: a sequence wastes less than one block, "
        "so shorter sequences waste a larger share",
    )


# Claims of techniques that may not be registered in this checkout, keyed by technique name: the
# report lists them ("not in this run") when the registry has no technique of that name. None today:
# combined_training's, once here, is declared by its package (gpubench.techniques.combined_training.claims)
# and always registered.
FALLBACK_CLAIMS: dict[str, tuple[Claim, ...]] = {}
