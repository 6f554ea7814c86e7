"""Statistics over raw timing samples. Pure functions: samples in, figures out.

Speedups are ``median(baseline) / median(variant)``: above 1 means the variant is faster.
Confidence intervals are percentile bootstraps (resampling each sample set independently),
seeded so the same samples always give the same interval. A p-value shown beside such an interval
comes from the same replicates (:func:`bootstrap_p`): the 95% interval excludes no change exactly
when p < 0.05, so the two never contradict each other.

A figure from fewer than :data:`MIN_CI_SAMPLES` samples has no interval (``ci_low`` and
``ci_high`` are None, the median or ratio is kept) and no p (None): one sample resampled gives
itself, an interval of no width that looks surer than any figure. Five is the default ``min_reps``; it is
also about where the method starts to hold: a distribution-free 95% interval for a median needs 6
samples (order statistics: the two extremes of 6 cover the median with 1 - 2 x 0.5^6 = 96.9%,
of 5 only 93.8%), and the percentile bootstrap at 5 samples covers about 94%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gpubench.lazy import LazyModule

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")  # imported when first used (0.1 s of a command's start)


BOOTSTRAP_RESAMPLES = 2000
CI_LEVEL = 0.95
MIN_CI_SAMPLES = 5  # fewer samples than this (per sample set): no confidence interval


def has_interval(n: int | None) -> bool:
    """Whether ``n`` samples (per sample set) are enough for a confidence interval."""
    return n is not None and n >= MIN_CI_SAMPLES


@dataclass(frozen=True)
class SampleStats:
    n: int
    median: float
    mean: float
    std: float
    min: float
    max: float
    q25: float
    q75: float
    iqr: float
    ci_low: float | None  # bootstrap 95% CI of the median; None under MIN_CI_SAMPLES samples
    ci_high: float | None

    @property
    def has_interval(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None

    def bounds(self) -> tuple[float, float]:
        """(ci_low, ci_high), where :attr:`has_interval` holds; ValueError where there is none."""
        if self.ci_low is None or self.ci_high is None:
            raise ValueError(f"{self.n} samples give no interval")
        return self.ci_low, self.ci_high

    @property
    def iqr_over_median(self) -> float:
        return self.iqr / self.median if self.median > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:  # (the fields' own types: floats, n an int, tails a tuple)
        d = asdict(self)
        d["iqr_over_median"] = self.iqr_over_median
        return d


@dataclass(frozen=True)
class RatioCI:
    ratio: float  # median(numerator) / median(denominator)
    ci_low: float | None  # None: a side had fewer than MIN_CI_SAMPLES samples (the ratio stands alone)
    ci_high: float | None
    n: int | None = None  # the fewest samples of any side (None where not given)

    @property
    def has_interval(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None

    def bounds(self) -> tuple[float, float]:
        """(ci_low, ci_high), where :attr:`has_interval` holds (a type checker does not see through
        the property); ValueError where there is no interval."""
        if self.ci_low is None or self.ci_high is None:
            raise ValueError(f"a ratio of {self.n} samples has no interval")
        return self.ci_low, self.ci_high

    def to_dict(self) -> dict[str, Any]:  # (the fields' own types)
        return asdict(self)


def _array(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError("need a non-empty 1-D sequence of samples")
    if not np.all(np.isfinite(a)):
        raise ValueError("samples must be finite")
    return a


def median(samples: Sequence[float]) -> float:
    return float(np.median(_array(samples)))


def iqr(samples: Sequence[float]) -> float:
    q25, q75 = np.percentile(_array(samples), [25, 75])
    return float(q75 - q25)


def bootstrap_medians(
    samples: Sequence[float] | np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """Medians of ``resamples`` bootstrap resamples (with replacement) of ``samples``."""
    a = _array(samples)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(resamples, a.size))
    return np.median(a[idx], axis=1)


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def summarize(samples: Sequence[float], level: float = CI_LEVEL, seed: int = 0) -> SampleStats:
    a = _array(samples)
    q25, med, q75 = np.percentile(a, [25, 50, 75])
    lo, hi = _interval(bootstrap_medians(a, seed=seed), level) if has_interval(a.size) else (None, None)
    return SampleStats(
        n=int(a.size),
        median=float(med),
        mean=float(a.mean()),
        std=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        min=float(a.min()),
        max=float(a.max()),
        q25=float(q25),
        q75=float(q75),
        iqr=float(q75 - q25),
        ci_low=lo,
        ci_high=hi,
    )


def bootstrap_ratio_ci(
    numerator: Sequence[float], denominator: Sequence[float], level: float = CI_LEVEL, seed: int = 0
) -> RatioCI:
    """Ratio of medians ``median(numerator) / median(denominator)`` with a bootstrap CI.

    For a speedup pass the baseline's times as ``numerator`` and the variant's as ``denominator``.
    With fewer than :data:`MIN_CI_SAMPLES` samples on either side the ratio has no interval
    (``ci_low`` and ``ci_high`` None); ``n`` is the fewer of the two sides' samples.
    """
    return bootstrap_ratio_test(numerator, denominator, level, seed)[0]


def _ratio_replicates(num: np.ndarray, den: np.ndarray, seed: int) -> np.ndarray:
    """Bootstrap replicates of the ratio of medians (each set resampled on its own)."""
    boot_num = bootstrap_medians(num, seed=seed)
    boot_den = bootstrap_medians(den, seed=seed + 1)
    boot_den = np.where(boot_den > 0, boot_den, np.nan)
    boot = boot_num / boot_den
    return boot[np.isfinite(boot)]


def bootstrap_ratio_test(
    numerator: Sequence[float], denominator: Sequence[float], level: float = CI_LEVEL, seed: int = 0, null: float = 1.0
) -> tuple[RatioCI, float | None]:
    """:func:`bootstrap_ratio_ci` and the two-sided p-value of "the ratio is ``null``" (no change),
    both from the same replicates (:func:`bootstrap_p`): the CI at ``level`` excludes ``null``
    exactly when p < 1 - ``level``. With fewer than :data:`MIN_CI_SAMPLES` samples on either side,
    neither: no interval and p None (no test rests on so few)."""
    num, den = _array(numerator), _array(denominator)
    if np.median(den) <= 0:
        raise ValueError("denominator median must be positive")
    ratio = float(np.median(num) / np.median(den))
    n = int(min(num.size, den.size))
    if not has_interval(n):
        return RatioCI(ratio=ratio, ci_low=None, ci_high=None, n=n), None
    boot = _ratio_replicates(num, den, seed)
    if not boot.size:
        return RatioCI(ratio, ratio, ratio, n), 1.0
    lo, hi = _interval(boot, level)
    return RatioCI(ratio=ratio, ci_low=lo, ci_high=hi, n=n), bootstrap_p(boot, null)


def bootstrap_p(replicates: Sequence[float] | np.ndarray, null: float = 1.0) -> float:
    """Two-sided bootstrap p-value of ``null`` from the replicates a percentile CI is read from: the
    smallest 1 - level at which that CI (:func:`_interval`, numpy's linear quantiles) would still
    exclude ``null``, i.e. twice the share of the replicates' quantile function on the smaller side
    of ``null``. So a CI at any level excludes ``null`` exactly when p < 1 - level. Never below one
    over the replicates' number (what they can resolve); 1 where ``null`` sits inside a run of equal
    replicates (no spread: no evidence)."""
    v = np.sort(np.asarray(replicates, dtype=np.float64))
    if not v.size:
        return 1.0
    if v.size == 1:
        return 1.0 if v[0] == null else 0.0
    t = np.linspace(0.0, 1.0, v.size)
    # below: the largest quantile level whose quantile is <= null; above: the smallest whose quantile is >= null
    if v[0] > null:
        below = 0.0
    elif v[-1] <= null:
        below = 1.0
    else:
        j = int(np.searchsorted(v, null, side="right")) - 1
        below = float(t[j] + (null - v[j]) / (v[j + 1] - v[j]) * (t[j + 1] - t[j]))
    if v[-1] < null:
        above = 1.0
    elif v[0] >= null:
        above = 0.0
    else:
        j = int(np.searchsorted(v, null, side="left"))
        above = float(t[j - 1] + (null - v[j - 1]) / (v[j] - v[j - 1]) * (t[j] - t[j - 1]))
    p = 2.0 * min(below, 1.0 - above)
    return float(min(1.0, max(p, 1.0 / v.size)))


def _run_ratio_medians(optimized: np.ndarray, control: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of median(optimized) / median(control) within one run. Variants with a
    sample per round (A B A B ...) are resampled by round, so drift within the run, which hits both
    alike, cancels as it did when they were timed; otherwise each set on its own."""
    resamples = BOOTSTRAP_RESAMPLES
    idx_opt = rng.integers(0, optimized.size, size=(resamples, optimized.size))
    idx_ctl = (
        idx_opt if control.size == optimized.size else rng.integers(0, control.size, size=(resamples, control.size))
    )
    return np.median(optimized[idx_opt], axis=1) / np.median(control[idx_ctl], axis=1)


def run_ratio_ci(
    optimized: Sequence[float], control: Sequence[float], level: float = CI_LEVEL, seed: int = 0
) -> RatioCI:
    """median(optimized) / median(control) within one run, with a percentile bootstrap CI that
    resamples interleaved rounds together where the variants have a sample per round (as
    :func:`relative_ratio_ci` does for each run). No interval under :data:`MIN_CI_SAMPLES` a side."""
    opt, ctl = _array(optimized), _array(control)
    ratio = float(np.median(opt) / np.median(ctl))
    n = int(min(opt.size, ctl.size))
    if not has_interval(n):
        return RatioCI(ratio, None, None, n)
    low, high = _interval(_run_ratio_medians(opt, ctl, np.random.default_rng(seed)), level)
    return RatioCI(ratio, low, high, n)


def relative_ratio_ci(
    base_optimized: Sequence[float],
    base_control: Sequence[float],
    cur_optimized: Sequence[float],
    cur_control: Sequence[float],
    level: float = CI_LEVEL,
    seed: int = 0,
) -> RatioCI:
    """How the optimized/baseline-variant time ratio changed, current vs stored run (above 1: the
    optimized variant lost ground on the baseline variant), with a percentile bootstrap CI; the two
    runs are resampled independently. No interval where any of the four has fewer than
    :data:`MIN_CI_SAMPLES` samples."""
    b_opt, b_ctl, c_opt, c_ctl = (
        np.asarray(x, dtype=np.float64) for x in (base_optimized, base_control, cur_optimized, cur_control)
    )
    ratio = float((np.median(c_opt) / np.median(c_ctl)) / (np.median(b_opt) / np.median(b_ctl)))
    n = int(min(b_opt.size, b_ctl.size, c_opt.size, c_ctl.size))
    if not has_interval(n):
        return RatioCI(ratio, None, None, n)
    rng = np.random.default_rng(seed)
    boot = _run_ratio_medians(c_opt, c_ctl, rng) / _run_ratio_medians(b_opt, b_ctl, rng)
    low, high = _interval(boot, level)
    return RatioCI(ratio, low, high, n)


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with tie and
    continuity corrections): how surprising the two sample sets would be if both came from one
    distribution. Pure numpy; adequate from about 8 samples a side. A public helper: the gate's p
    is :func:`bootstrap_ratio_test`'s, from the replicates of the CI printed beside it."""
    x, y = _array(a), _array(b)
    n1, n2 = x.size, y.size
    combined = np.concatenate([x, y])
    order = np.argsort(combined, kind="mergesort")
    ranks = np.empty(combined.size, dtype=np.float64)
    sorted_vals = combined[order]
    # average ranks over ties
    boundaries = np.flatnonzero(np.diff(sorted_vals)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [combined.size]])
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2.0  # mean of 1-based ranks s+1..e
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    mean = n1 * n2 / 2.0
    tie_term = ((ends - starts) ** 3 - (ends - starts)).sum()
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    z = (abs(u1 - mean) - 0.5) / math.sqrt(var)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0))))
