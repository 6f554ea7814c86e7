"""Statistics: medians, IQR and bootstrap intervals that cover what they claim to."""

import numpy as np
import pytest

from gpubench.records import stats


def test_summary_figures_match_numpy_on_known_samples():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.n == 5 and s.median == 3.0 and s.min == 1.0 and s.max == 100.0
    assert s.q25 == 2.0 and s.q75 == 4.0 and s.iqr == 2.0
    assert s.ci_low <= s.median <= s.ci_high


def test_bootstrap_ratio_ci_covers_a_known_ratio_at_about_the_stated_rate():
    # Baseline samples are the variant's scaled by exactly 1.5 in distribution; over many
    # independent experiments the 95% interval must contain 1.5 about 95% of the time.
    rng = np.random.default_rng(7)
    trials, covered = 200, 0
    for t in range(trials):
        fast = rng.lognormal(mean=0.0, sigma=0.1, size=40)
        slow = 1.5 * rng.lognormal(mean=0.0, sigma=0.1, size=40)
        ci = stats.bootstrap_ratio_ci(slow, fast, seed=t)
        covered += ci.ci_low <= 1.5 <= ci.ci_high
    assert 0.88 <= covered / trials <= 0.995


def test_ratio_ci_excludes_one_for_a_real_difference_and_includes_it_for_none():
    rng = np.random.default_rng(1)
    a = rng.normal(10.0, 0.2, size=50)
    b = rng.normal(10.0, 0.2, size=50)
    same = stats.bootstrap_ratio_ci(a, b)
    assert same.ci_low < 1.0 < same.ci_high
    faster = stats.bootstrap_ratio_ci(a, b * 0.8)
    assert faster.ci_low > 1.15 and faster.ratio == pytest.approx(np.median(a) / np.median(b * 0.8))


def test_intervals_are_reproducible_for_the_same_samples():
    x = list(np.random.default_rng(3).exponential(size=30))
    assert stats.summarize(x) == stats.summarize(x)


@pytest.mark.parametrize("n", [1, 2, stats.MIN_CI_SAMPLES - 1])
def test_a_median_from_fewer_than_min_ci_samples_has_no_interval(n):
    """Issue 34: one sample printed as [2.5, 2.5], an interval of no width that looks surer than
    any figure. Under MIN_CI_SAMPLES the median stands alone."""
    s = stats.summarize([2.5 + 0.1 * i for i in range(n)])
    assert s.ci_low is None and s.ci_high is None and not s.has_interval
    assert s.n == n and s.median == pytest.approx(float(np.median([2.5 + 0.1 * i for i in range(n)])))
    assert s.to_dict()["ci_low"] is None


def test_a_median_from_min_ci_samples_has_its_interval():
    s = stats.summarize([2.5, 2.6, 2.4, 2.7, 2.55][: stats.MIN_CI_SAMPLES])
    assert s.has_interval and s.ci_low <= s.median <= s.ci_high


@pytest.mark.parametrize("sizes", [(1, 1), (1, 40), (40, 4)])
def test_a_speedup_with_a_side_under_min_ci_samples_keeps_its_ratio_and_has_no_interval(sizes):
    """Issue 34: 0.37x [0.37, 0.37] from one timed call a variant; 37.22x [37.22, 37.22] at
    --repeat-scale 0.3. The ratio is kept (to show, with its count), the interval is not."""
    slow = [3.0 + 0.01 * i for i in range(sizes[0])]
    fast = [1.0 + 0.01 * i for i in range(sizes[1])]
    ci = stats.bootstrap_ratio_ci(slow, fast)
    assert ci.ratio == pytest.approx(np.median(slow) / np.median(fast))
    assert ci.ci_low is None and ci.ci_high is None and not ci.has_interval
    assert ci.n == min(sizes) and ci.to_dict()["n"] == min(sizes)


def test_a_speedup_with_min_ci_samples_a_side_has_its_interval_and_count():
    ci = stats.bootstrap_ratio_ci([3.0, 3.1, 2.9, 3.2, 3.05], [1.0, 1.1, 0.9, 1.05, 1.0, 0.95])
    assert ci.has_interval and ci.ci_low <= ci.ratio <= ci.ci_high and ci.n == stats.MIN_CI_SAMPLES


def test_a_relative_ratio_with_any_run_under_min_ci_samples_has_no_interval():
    many, one = [1.0, 1.1, 0.9, 1.05, 1.0], [1.2]
    rel = stats.relative_ratio_ci(many, many, one, many)
    assert rel.ratio == pytest.approx(1.2) and not rel.has_interval and rel.n == 1


def test_ratio_ci_keeps_its_positional_three_field_form():
    """gpubench.contract users may build a RatioCI as (ratio, low, high): ``n`` is optional."""
    ci = stats.RatioCI(1.2, 1.1, 1.3)
    assert ci.has_interval and ci.n is None


def test_the_bootstrap_at_min_ci_samples_covers_a_median_about_as_the_docstring_says():
    """MIN_CI_SAMPLES (5): the percentile bootstrap of a median from 5 samples covers about 94% (the
    docstring's figure; a distribution-free interval needs 6); from 2 samples far less."""
    rng = np.random.default_rng(11)

    def coverage(n: int, trials: int = 400) -> float:
        hits = 0
        for t in range(trials):
            x = rng.lognormal(0.0, 0.3, size=n)  # true median exp(0) = 1
            lo, hi = stats._interval(stats.bootstrap_medians(x, seed=t), stats.CI_LEVEL)
            hits += lo <= 1.0 <= hi
        return hits / trials

    assert 0.88 <= coverage(stats.MIN_CI_SAMPLES) <= 0.98
    assert coverage(2) < 0.6


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_empty_or_non_finite_samples_are_rejected(bad):
    with pytest.raises(ValueError):
        stats.summarize(bad)


def _small_heavy_tailed(rng, n):
    """Few samples with ties and a heavy tail, where a percentile CI and a separate test disagree most."""
    return rng.choice([1.0, 1.1, 1.2, 1.3, 0.9], n) * np.where(rng.random(n) < 0.3, rng.uniform(1.2, 2.0, n), 1.0)


@pytest.mark.parametrize("level", [0.95, 0.998])
def test_the_bootstrap_p_and_ci_from_the_same_replicates_never_disagree(level):
    # issue 34: "+20.8% [-18.2, +22.1], p 1" and "-36.5% [-37.5, -35.5], p 0.2": a CI and a p of two
    # methods. From one set of replicates, the CI at a level excludes no change exactly when p < 1 - level.
    rng = np.random.default_rng(5)
    for seed in range(300):
        a, b = _small_heavy_tailed(rng, int(rng.integers(2, 30))), _small_heavy_tailed(rng, int(rng.integers(2, 30)))
        ci, p = stats.bootstrap_ratio_test(a, b * rng.uniform(0.7, 1.3), level=level, seed=seed)
        if not ci.has_interval:  # under MIN_CI_SAMPLES a side: neither an interval nor a p
            assert p is None and min(a.size, b.size) < stats.MIN_CI_SAMPLES
            continue
        assert (ci.ci_low > 1 or ci.ci_high < 1) == (p < 1 - level), (seed, ci, p)


def test_the_ratio_test_s_ci_is_bootstrap_ratio_ci_s_and_its_p_is_two_sided():
    rng = np.random.default_rng(6)
    a, b = rng.lognormal(0, 0.2, 30), rng.lognormal(0, 0.2, 30)
    ci, p = stats.bootstrap_ratio_test(a, b, seed=4)
    assert ci == stats.bootstrap_ratio_ci(a, b, seed=4) and 0.05 < p <= 1
    assert (
        stats.bootstrap_ratio_test(a * 1.5, b, seed=4)[1]
        == stats.bootstrap_ratio_test(b, a * 1.5, seed=4)[1]
        == 1 / stats.BOOTSTRAP_RESAMPLES
    )  # no replicate on the far side: what 2,000 of them can resolve, not 0


def test_too_few_samples_give_the_ratio_test_neither_an_interval_nor_a_p():
    ci, p = stats.bootstrap_ratio_test([1.0, 1.1, 1.2, 1.3], [2.0] * 30)
    assert (ci.ci_low, ci.ci_high, ci.n, p) == (None, None, 4, None) and ci.ratio == pytest.approx(1.15 / 2.0)


def test_the_bootstrap_p_of_replicates_that_sit_on_no_change_is_1():
    assert stats.bootstrap_p([1.0] * 50) == 1.0 and stats.bootstrap_p([0.9] * 10 + [1.0] * 30 + [1.1] * 10) == 1.0
    assert stats.bootstrap_p([1.1] * 50) == pytest.approx(1 / 50)
