"""Metrics of uamt.uncertainty: hand-computed values, closed-form Gaussian cases, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import integrate, stats

from uamt.uncertainty import (
    average_over_references,
    combine_heteroscedastic_samples,
    confidence_levels,
    expected_calibration_error,
    gaussian_crps,
    gaussian_crps_loss,
    gaussian_interval,
    gaussian_nll_loss,
    interval_coverage,
    mean_interval_width,
    parse_samples_field,
    predictive_pearson_score,
    probit,
    reliability_curve,
    samples_to_mu_sigma,
    sharpness_loss,
    translation_risk,
    uncertainty_metrics,
    uncertainty_pearson_score,
)

# Tiny reference case, every value below computed by hand.
HUMAN = np.array([1.0, 2.0, 3.0, 4.0])
MU = np.array([1.5, 2.0, 2.0, 5.0])
SIGMA = np.array([0.5, 1.0, 1.0, 2.0])  # |err| / sigma = [1, 0, 1, 0.5]


def test_probit_is_the_standard_normal_quantile():
    assert probit(0.5) == pytest.approx(0.0)
    assert probit(0.975) == pytest.approx(1.959963985, abs=1e-8)
    assert probit(1.0) == math.inf


def test_pps_hand_computed():
    # deviations: human [-1.5,-.5,.5,1.5], mu [-1.125,-.625,-.625,2.375]; cross sum 5.25
    assert predictive_pearson_score(HUMAN, MU) == pytest.approx(5.25 / math.sqrt(5.0 * 7.6875))


def test_ups_uses_abs_error_and_sigma_hand_computed():
    # |err| = [.5, 0, 1, 1] (mean .625), sigma mean 1.125; cross sum .4375
    assert uncertainty_pearson_score(HUMAN, MU, SIGMA) == pytest.approx(0.4375 / math.sqrt(0.6875 * 1.1875))


def test_ups_undefined_for_constant_sigma():
    assert math.isnan(uncertainty_pearson_score(HUMAN, MU, np.full(4, 0.7)))


def test_nll_hand_computed():
    # 0.5*log(2*pi*s^2) averages to 0.5*log(2*pi) (log .25 + log 4 cancel); squared terms: .5, 0, .5, .125
    expected = 0.5 * math.log(2 * math.pi) + (0.5 + 0.0 + 0.5 + 0.125) / 4
    assert gaussian_nll_loss(HUMAN, MU, SIGMA) == pytest.approx(expected)
    assert gaussian_nll_loss(HUMAN, MU, SIGMA) == pytest.approx(-np.mean(stats.norm.logpdf(HUMAN, MU, SIGMA)))


def test_nll_rejects_zero_sigma():
    with pytest.raises(ValueError, match=r"sigma\[1\] = 0"):
        gaussian_nll_loss(HUMAN, MU, [1.0, 0.0, 1.0, 1.0])


def test_sharpness_is_mean_variance():
    assert sharpness_loss(SIGMA) == pytest.approx((0.25 + 1 + 1 + 4) / 4)


def test_coverage_hand_computed():
    # z = [1, 0, 1, .5]; probit(.75) = .674 covers z in {0, .5}; probit(.95) = 1.645 covers all
    assert interval_coverage(HUMAN, MU, SIGMA, 0.5) == 0.5
    assert interval_coverage(HUMAN, MU, SIGMA, 0.9) == 1.0
    assert interval_coverage(HUMAN, MU, SIGMA, 0.0) == 0.25  # only the exact prediction


def test_ece_hand_computed_three_levels():
    # levels [0, .5, 1] -> observed [.25, .5, 1]; ECE = (.25 + 0 + 0) / 3
    expected, observed = reliability_curve(HUMAN, MU, SIGMA, n_levels=3)
    np.testing.assert_allclose(expected, [0.0, 0.5, 1.0])
    np.testing.assert_allclose(observed, [0.25, 0.5, 1.0])
    assert expected_calibration_error(HUMAN, MU, SIGMA, n_levels=3) == pytest.approx(1 / 12)


def test_confidence_levels_match_the_authors_code():
    np.testing.assert_allclose(confidence_levels(), np.linspace(0, 1, 100))


def test_interval_and_width():
    lower, upper = gaussian_interval(MU, SIGMA, 0.95)
    np.testing.assert_allclose(upper - MU, SIGMA * 1.959963985, rtol=1e-8)
    np.testing.assert_allclose(MU - lower, SIGMA * 1.959963985, rtol=1e-8)
    assert mean_interval_width(SIGMA, 0.9) == pytest.approx(2 * 1.125 * 1.6448536270)


def test_crps_hand_value_and_sigma_zero_limit():
    # y = mu, sigma = 1: CRPS = 2*phi(0) - 1/sqrt(pi) = (sqrt 2 - 1)/sqrt(pi)
    assert gaussian_crps([0.0], [0.0], [1.0])[0] == pytest.approx((math.sqrt(2) - 1) / math.sqrt(math.pi))
    assert gaussian_crps([3.0], [1.0], [0.0])[0] == pytest.approx(2.0)  # MAE limit


@pytest.mark.parametrize(("y", "mu", "sigma"), [(0.3, 0.0, 1.0), (-2.0, 1.0, 0.5), (5.0, 4.0, 3.0)])
def test_crps_matches_numerical_integration(y, mu, sigma):
    def integrand(x):
        return (stats.norm.cdf(x, mu, sigma) - (x >= y)) ** 2

    left, _ = integrate.quad(integrand, mu - 40 * sigma, y, limit=200)
    right, _ = integrate.quad(integrand, y, mu + 40 * sigma, limit=200)
    assert gaussian_crps([y], [mu], [sigma])[0] == pytest.approx(left + right, rel=1e-6)


def test_translation_risk_is_the_gaussian_cdf():
    risk = translation_risk(
        [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 2.0, 0.0], threshold=[0.0, 1.959963985, 1.0, 0.5]
    )
    np.testing.assert_allclose(risk, [0.5, 0.975, 0.5, 0.0], atol=1e-8)


@pytest.fixture(scope="module")
def gaussian_draws():
    rng = np.random.default_rng(1234)
    n = 20_000
    mu = rng.normal(size=n)
    sigma = rng.uniform(0.2, 2.0, size=n)
    return rng.normal(mu, sigma), mu, sigma


def test_true_sigma_is_calibrated_and_nll_is_the_entropy(gaussian_draws):
    human, mu, sigma = gaussian_draws
    assert expected_calibration_error(human, mu, sigma) < 0.01
    entropy = np.mean(0.5 * np.log(2 * math.pi * math.e * sigma**2))
    assert gaussian_nll_loss(human, mu, sigma) == pytest.approx(entropy, abs=0.02)
    for gamma in (0.5, 0.8, 0.9, 0.95):
        assert interval_coverage(human, mu, sigma, gamma) == pytest.approx(gamma, abs=0.01)


def test_too_narrow_and_too_wide_sigma_have_high_ece(gaussian_draws):
    human, mu, sigma = gaussian_draws
    assert expected_calibration_error(human, mu, 0.4 * sigma) > 0.2
    assert expected_calibration_error(human, mu, 3.0 * sigma) > 0.2
    assert interval_coverage(human, mu, 0.4 * sigma, 0.9) < 0.6


def test_crps_prefers_the_true_sigma(gaussian_draws):
    human, mu, sigma = gaussian_draws
    true = gaussian_crps_loss(human, mu, sigma)
    assert true < gaussian_crps_loss(human, mu, 0.5 * sigma)
    assert true < gaussian_crps_loss(human, mu, 2.0 * sigma)


def test_uncertainty_metrics_keys_and_none_for_undefined():
    result = uncertainty_metrics(HUMAN, MU, np.full(4, 1.0), n_levels=3)
    assert set(result) == {
        "n", "pps", "ups", "nll", "ece", "ece_floor", "sharpness", "coverage@0.9", "width@0.9", "crps"
    }
    assert result["ups"] is None and result["n"] == 4


@pytest.mark.parametrize(
    ("bad", "match"),
    [([1.0, np.nan, 1.0, 1.0], r"sigma\[1\].*not finite"), ([1.0, -1.0, 1.0, 1.0], r"sigma\[1\].*negative")],
)
def test_bad_sigma_is_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        expected_calibration_error(HUMAN, MU, bad)


def test_length_mismatch_is_rejected():
    with pytest.raises(ValueError, match="differ in length"):
        predictive_pearson_score(HUMAN, MU[:3])


finite = st.floats(min_value=-100, max_value=100, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(finite, finite, st.floats(min_value=0.01, max_value=50)), min_size=3, max_size=40
    ),
    seed=st.integers(0, 2**32 - 1),
)
# Found by CI (2026-11-29): sigmas one ulp apart made UPS depend on the rows' order (0.577 vs 0.816)
# while the means were summed pairwise.
@example(data=[(0.0, 0.0, 0.01), (0.0, 0.0, 0.01), (0.0, 1.0, 0.010000000000000002)], seed=0)
def test_metrics_are_invariant_to_row_order(data, seed):
    human, mu, sigma = (np.array(column) for column in zip(*data, strict=True))
    order = np.random.default_rng(seed).permutation(len(human))
    original = uncertainty_metrics(human, mu, sigma, n_levels=20)
    shuffled = uncertainty_metrics(human[order], mu[order], sigma[order], n_levels=20)
    for key, value in original.items():
        if value is None:
            assert shuffled[key] is None
        else:
            assert shuffled[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


@settings(max_examples=40, deadline=None)
@given(arrays(float, st.tuples(st.integers(1, 10), st.integers(2, 10)), elements=finite))
def test_samples_to_mu_sigma_matches_numpy_ddof0(samples):
    mu, sigma = samples_to_mu_sigma(samples)
    np.testing.assert_allclose(mu, samples.mean(axis=1))
    np.testing.assert_allclose(sigma, samples.std(axis=1, ddof=0))
    flipped_mu, flipped_sigma = samples_to_mu_sigma(samples[:, ::-1])
    # Summation order moves the result by a few ulps of the samples' scale (|x| <= 100), which is
    # all of a subnormal mean (hypothesis found 3e-268 vs 1e-268): an absolute tolerance at that scale.
    np.testing.assert_allclose(flipped_mu, mu, atol=1e-12)
    np.testing.assert_allclose(flipped_sigma, sigma, atol=1e-12)


def test_samples_hand_computed_and_ddof_choice():
    mu, sigma = samples_to_mu_sigma([[1.0, 2.0, 3.0]])
    assert mu[0] == 2.0 and sigma[0] == pytest.approx(math.sqrt(2 / 3))
    _, sigma1 = samples_to_mu_sigma([[1.0, 2.0, 3.0]], ddof=1)
    assert sigma1[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="2-D"):
        samples_to_mu_sigma([1.0, 2.0])


def test_average_over_references_and_hts_mcd_total_variance():
    per_ref = np.array([[[1.0, 3.0], [3.0, 5.0]]])  # 1 segment, 2 refs, 2 samples
    np.testing.assert_allclose(average_over_references(per_ref), [[2.0, 4.0]])
    mu, sigma, epistemic, aleatoric = combine_heteroscedastic_samples([[1.0, 3.0]], [[0.5, 1.5]])
    assert mu[0] == 2.0 and epistemic[0] == 1.0 and aleatoric[0] == 1.0
    assert sigma[0] == pytest.approx(math.sqrt(2.0))


def test_parse_samples_field():
    np.testing.assert_allclose(parse_samples_field(" 0.5| 1 |-2e-1"), [0.5, 1.0, -0.2])
    with pytest.raises(ValueError, match="sample 2 'x' is not a number"):
        parse_samples_field("1|x|3")
    with pytest.raises(ValueError, match="sample 3 is empty"):
        parse_samples_field("1|2|")


def test_ece_sampling_floor_matches_the_binomial_approximation():
    from uamt.uncertainty import confidence_levels, ece_sampling_floor

    n = 1000
    gammas = confidence_levels(100)
    # E|acc - gamma| ~ sqrt(2 gamma (1 - gamma) / (pi n)) for a binomial proportion
    approx = float(np.mean(np.sqrt(2 * gammas * (1 - gammas) / (math.pi * n))))
    assert ece_sampling_floor(n) == pytest.approx(approx, rel=0.1)
    assert ece_sampling_floor(4 * n) == pytest.approx(ece_sampling_floor(n) / 2, rel=0.15)
    with pytest.raises(ValueError, match="n_segments=0"):
        ece_sampling_floor(0)


def test_a_calibrated_model_sits_at_the_floor_and_a_miscalibrated_one_above_it():
    from uamt.uncertainty import ece_sampling_floor, expected_calibration_error

    rng = np.random.default_rng(3)
    n = 1144
    eces = []
    for _ in range(40):
        sigma = rng.uniform(0.5, 2.0, n)
        human = sigma * rng.standard_normal(n)
        eces.append(expected_calibration_error(human, np.zeros(n), sigma))
    assert np.mean(eces) == pytest.approx(ece_sampling_floor(n), rel=0.25)
    human = 2.0 * rng.standard_normal(n)  # sigma underestimated by half
    assert expected_calibration_error(human, np.zeros(n), np.ones(n)) > 5 * ece_sampling_floor(n)


def test_effective_sample_size_follows_the_design_effect():
    from uamt.uncertainty import effective_sample_size

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(400), 10)
    independent = rng.standard_normal(groups.size)
    assert effective_sample_size(independent, groups) == pytest.approx(groups.size, rel=0.15)
    # rho = 0.5 within groups of 10: design effect 1 + 9 * 0.5 = 5.5
    shared = np.sqrt(0.5) * rng.standard_normal(400)[groups] + np.sqrt(0.5) * rng.standard_normal(groups.size)
    assert effective_sample_size(shared, groups) == pytest.approx(groups.size / 5.5, rel=0.15)
    assert effective_sample_size(shared, np.arange(groups.size)) == groups.size
    # order of rows does not matter
    order = rng.permutation(groups.size)
    assert effective_sample_size(shared[order], groups[order]) == pytest.approx(effective_sample_size(shared, groups))
    with pytest.raises(ValueError, match="one label per value"):
        effective_sample_size(shared, groups[:5])


def test_macro_mean_se_by_hand_and_by_simulation():
    from uamt.uncertainty.metrics import macro_mean_se

    # stratum a: groups {1, 2} with values {1, 3} and {5}; mean 3, centred -2, 0 | 2: sums -2, 2
    # stratum b: groups {1}, {2}: values 0, 4; mean 2, sums -2, 2
    values = np.array([1.0, 3.0, 5.0, 0.0, 4.0])
    strata = np.array(["a", "a", "a", "b", "b"])
    groups = np.array([1, 1, 2, 1, 2])  # a group is counted within its stratum
    var_a, var_b = (4 + 4) / 3**2, (4 + 4) / 2**2
    assert macro_mean_se(values, strata, groups) == pytest.approx(math.sqrt(var_a + var_b) / 2)
    # one group per stratum: no variance estimable, 0 (as every sandwich estimator)
    assert macro_mean_se(values, strata, np.zeros(5)) == 0.0
    # clustered rows: the se of 400 documents of 10 shared-difficulty rows matches its spread
    rng = np.random.default_rng(1)
    docs = np.repeat(np.arange(400), 10)
    lp = np.where(docs < 200, "x", "y")
    means = []
    for _ in range(300):
        shared = rng.standard_normal(400)[docs] + rng.standard_normal(docs.size)
        means.append(np.mean([shared[lp == s].mean() for s in ("x", "y")]))
    shared = rng.standard_normal(400)[docs] + rng.standard_normal(docs.size)
    assert macro_mean_se(shared, lp, docs) == pytest.approx(np.std(means), rel=0.15)
    assert macro_mean_se(shared, lp, np.arange(docs.size)) < 0.5 * macro_mean_se(shared, lp, docs)
    with pytest.raises(ValueError, match="one label per value"):
        macro_mean_se(values, strata[:2], groups)
    with pytest.raises(ValueError, match="finite"):
        macro_mean_se(np.array([np.nan, 1.0]), np.array(["a", "a"]), np.array([1, 2]))


# ---------------------------------------------------------------------------------- conditional calibration
from uamt.uncertainty.metrics import (  # noqa: E402
    conditional_coverage_error,
    expected_normalized_calibration_error,
    grouped_coverage,
    quantile_groups,
    sigma_spread_ratio,
)


def test_quantile_groups_by_hand():
    np.testing.assert_array_equal(quantile_groups([5.0, 1.0, 3.0, 2.0, 4.0], 5), [4, 0, 2, 1, 3])
    # ties by position; 7 rows in 2 groups: ranks 0..3 -> 0, 4..6 -> 1
    np.testing.assert_array_equal(quantile_groups([1.0] * 7, 2), [0, 0, 0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match=r"n_groups=6 must lie in \[1, n=5\]"):
        quantile_groups([1.0, 2.0, 3.0, 4.0, 5.0], 6)


def test_grouped_coverage_and_conditional_error_by_hand():
    # gamma = 0.9: inside iff |err| <= 1.6449 sigma
    human = np.array([0.0, 0.0, 0.0, 0.0])
    mu = np.array([1.0, 2.0, 1.0, 1.0])
    sigma = np.ones(4)
    groups = np.array(["a", "a", "b", "b"])
    by_group = grouped_coverage(human, mu, sigma, groups, 0.9)
    assert by_group == {"a": {"coverage": 0.5, "n": 2.0}, "b": {"coverage": 1.0, "n": 2.0}}
    assert conditional_coverage_error(human, mu, sigma, groups, 0.9) == pytest.approx(0.4)
    with pytest.raises(ValueError, match=r"groups must have one label per segment \(4\)"):
        grouped_coverage(human, mu, sigma, groups[:3], 0.9)


def test_ence_by_hand():
    # two bins of two rows: sigma 1 with errors 1, 1 (RMSE 1: gap 0); sigma 2 with errors 1, 1 (gap |2-1|/2)
    human = np.zeros(4)
    mu = np.array([1.0, -1.0, 1.0, -1.0])
    sigma = np.array([1.0, 1.0, 2.0, 2.0])
    assert expected_normalized_calibration_error(human, mu, sigma, 2) == pytest.approx((0.0 + 0.5) / 2)
    with pytest.raises(ValueError, match=r"sigma\[0\] = 0: the ENCE divides"):
        expected_normalized_calibration_error(human, mu, np.array([0.0, 1.0, 1.0, 1.0]), 2)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.floats(min_value=0.1, max_value=10.0))
def test_ence_is_zero_when_sigma_is_the_error_and_scale_free(seed, scale):
    rng = np.random.default_rng(seed)
    sigma = rng.uniform(0.1, 3.0, size=40)
    mu = rng.normal(size=40)
    human = mu + sigma * rng.choice([-1.0, 1.0], size=40)
    assert expected_normalized_calibration_error(human, mu, sigma, 4) == pytest.approx(0.0, abs=1e-12)
    noisy = mu + rng.normal(size=40)
    assert expected_normalized_calibration_error(scale * noisy, scale * mu, scale * sigma, 4) == pytest.approx(
        expected_normalized_calibration_error(noisy, mu, sigma, 4)
    )


def test_sigma_spread_ratio_by_hand():
    sigma = np.arange(1.0, 12.0)  # 1..11: P10 = 2, P90 = 10
    assert sigma_spread_ratio(sigma) == pytest.approx(5.0)
    assert sigma_spread_ratio(np.full(5, 0.7)) == 1.0
    assert sigma_spread_ratio(np.array([0.0, 0.0, 1.0])) == math.inf
    with pytest.raises(ValueError, match=r"lower=0.9 must be below upper=0.1"):
        sigma_spread_ratio(sigma, upper=0.1, lower=0.9)


def test_pearson_scores_are_exactly_order_invariant_for_values_ulps_apart():
    # sigma 0.01, 0.01, 0.01 + 1 ulp: every order of the rows gives the same UPS, to the bit
    human = np.zeros(3)
    mu = np.array([0.0, 0.0, 1.0])
    sigma = np.array([0.01, 0.01, np.nextafter(0.01, 1.0)])
    values = {
        uncertainty_pearson_score(human[list(order)], mu[list(order)], sigma[list(order)])
        for order in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
    }
    assert len(values) == 1
    assert values.pop() == pytest.approx(math.sqrt(2.0 / 3.0))


def test_pearson_r_hand_value_and_undefined_cases():
    from uamt.core.stats import pearson_r

    # x = (1, 2, 3, 4), y = (2, 1, 4, 3): centred sums 3 (xy), 5 (xx), 5 (yy) -> r = 3 / 5
    assert pearson_r([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6, abs=1e-15)
    assert pearson_r([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(pearson_r([1.0], [2.0]))
    assert math.isnan(pearson_r([1, 1, 1], [1, 2, 3]))
    assert math.isnan(pearson_r([1, 2, 3], [1, 2, np.inf]))  # an infinite sigma: r undefined
    assert math.isnan(pearson_r([1, 2, 3], [3, 2, 2], min_rows=4))
    # 0.1 three times: np.std is ~1e-17, not 0, so a std check called it non-constant
    assert math.isnan(pearson_r([0.1, 0.1, 0.1], [1, 2, 3]))
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\)"):
        pearson_r([1, 2, 3], [1, 2])


def test_pearson_or_none_is_pearson_r_with_none_for_undefined():
    from uamt.core.stats import pearson_or_none

    assert pearson_or_none([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6, abs=1e-15)
    assert pearson_or_none([1, 1, 1], [1, 2, 3]) is None
    assert pearson_or_none([1, 2, 3], [3, 2, 2], min_rows=4) is None
    assert pearson_or_none([1, 2, 3], [3, 2, 2], min_rows=3) == pytest.approx(-0.8660254037844387)
    with pytest.raises(ValueError, match="shapes"):
        pearson_or_none([1, 2, 3], [1, 2])
