"""σ's weight chosen by the calibration: the tempering formula, its round trip through the artifact,
the served distribution reading the model's own σ, and the cross-fitted choice."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from tests.test_top_atom import BOUNDS
from tests.test_top_atom import SIGNED as ATOM_SETTINGS
from uamt.core.errors import UamtError
from uamt.model_evaluation import choose_sigma_weight, choose_unseen_sigma_weight
from uamt.serving.model_calibration import (
    Calibration,
    attach_distribution,
    fit_calibration,
    refit_global_fallback,
    refit_served,
    with_sigma_tempering,
    with_top_atom,
)
from uamt.uncertainty import GLOBAL, EvaluationSettings
from uamt.uncertainty.tempering import SigmaTempering

# the zero-inflated tests' settings, with a weight to choose
SIGNED = dataclasses.replace(ATOM_SETTINGS, sigma_weights=(0.0, 1.0))


def mqm_like(seed: int, n: int, informative: bool) -> pd.DataFrame:
    """Rows whose error scale ``s`` varies 10x; ``sigma`` is ``s`` (informative) or drawn apart from it."""
    rng = np.random.default_rng(seed)
    lp = np.array(["en-ru", "zh-en"], dtype=object)[rng.integers(0, 2, n)]
    latent = -rng.gamma(1.5, 2.5, n)
    scale = np.exp(rng.uniform(np.log(0.4), np.log(4.0), n))
    human = np.clip(latent + scale * rng.normal(size=n), -25.0, 0.0)
    sigma = scale if informative else np.exp(rng.uniform(np.log(0.4), np.log(4.0), n))
    doc = np.array([f"{lp[i]}/d{i // 10}" for i in range(n)], dtype=object)
    return pd.DataFrame({"lp": lp, "human": human, "mu": latent, "sigma": sigma, "doc": doc})


def test_tempering_hand_computed_and_refuses_what_it_cannot_serve():
    tempering = SigmaTempering.fit([1.0, 4.0, 9.0, 16.0, 0.0], ["a", "a", "b", "b", "b"], 0.5)
    # medians over the positive sigma: a (1, 4) -> 2.5, b (9, 16) -> 12.5, every row -> 6.5
    assert tempering.medians == {"a": 2.5, "b": 12.5, GLOBAL: 6.5}
    got = tempering.apply([4.0, 9.0, 4.0], np.array(["a", "b", "unseen"], dtype=object))
    np.testing.assert_allclose(got, [np.sqrt(2.5 * 4.0), np.sqrt(12.5 * 9.0), np.sqrt(6.5 * 4.0)])
    np.testing.assert_allclose(tempering.apply([4.0, 1.0], None), np.sqrt(6.5 * np.array([4.0, 1.0])))
    assert dataclasses.replace(tempering, weight=0.0).apply([4.0, 0.1], "a").tolist() == [2.5, 2.5]
    identity = dataclasses.replace(tempering, weight=1.0)
    assert identity.is_identity and identity.apply([4.0, 0.1], "a").tolist() == [4.0, 0.1]
    assert SigmaTempering.from_dict(json.loads(json.dumps(tempering.to_dict()))) == tempering
    with pytest.raises(ValueError, match=r"weight = 1.5 must be in \[0, 1\]"):
        SigmaTempering.fit([1.0], ["a"], 1.5)
    assert "medians[a] = -1.0 must be a finite number > 0" in SigmaTempering(0.5, {"a": -1.0, GLOBAL: 1.0}).problem()
    with pytest.raises(ValueError, match=r"sigma_weights=\[0.0, 2.0\] not supported"):
        EvaluationSettings(sigma_weights=(0.0, 2.0))


@pytest.fixture(scope="module")
def noise_sigma():
    dev, test = mqm_like(0, 2500, informative=False), mqm_like(1, 800, informative=False)
    calibration, _ = fit_calibration(dev, "hts", settings=SIGNED)
    return dev, test, calibration


def test_a_tempered_calibration_serves_the_models_own_sigma_as_one_fitted_on_tempered_sigma(tmp_path, noise_sigma):
    """Fitting on σ_λ and serving the model's σ through the artifact's tempering are the same
    distribution, and at λ = 0 the answers no longer depend on σ within an LP."""
    dev, test, calibration = noise_sigma
    lp = dev["lp"].to_numpy(dtype=object)
    tempering = SigmaTempering.fit(dev["sigma"], lp, 0.5)
    served = with_top_atom(with_sigma_tempering(calibration, tempering), dev, "hts", SIGNED, BOUNDS[1])
    refitted = refit_served(dev, "hts", served, SIGNED)
    by_hand = refit_served(dev.assign(sigma=tempering.apply(dev["sigma"], lp)), "hts", dataclasses.replace(served, sigma_tempering=None), SIGNED)
    mu, sigma, test_lp = test["mu"].to_numpy(), test["sigma"].to_numpy(), test["lp"].to_numpy(dtype=object)
    tempered_sigma = tempering.apply(sigma, test_lp)
    assert refitted.sigma_tempering == tempering and refitted.below_top.sigma_tempering == tempering
    for gamma in (0.5, 0.9):
        np.testing.assert_allclose(refitted.interval(mu, sigma, gamma, test_lp), by_hand.interval(mu, tempered_sigma, gamma, test_lp))
    np.testing.assert_allclose(refitted.risk(mu, sigma, -5.0, test_lp), by_hand.risk(mu, tempered_sigma, -5.0, test_lp))
    refitted.save(tmp_path / "hts.json")
    loaded = Calibration.load(tmp_path / "hts.json")
    np.testing.assert_array_equal(loaded.risk(mu, sigma, -5.0, test_lp), refitted.risk(mu, sigma, -5.0, test_lp))
    flat = refit_served(dev, "hts", with_sigma_tempering(served, dataclasses.replace(tempering, weight=0.0)), SIGNED)
    np.testing.assert_array_equal(flat.interval(mu, sigma, 0.9, test_lp), flat.interval(mu, 3.0 * sigma, 0.9, test_lp))
    data = json.loads((tmp_path / "hts.json").read_text())
    data["sigma_tempering"]["medians"]["en-ru"] = 0.0
    (tmp_path / "broken.json").write_text(json.dumps(data))
    with pytest.raises(UamtError, match=r"broken.json: sigma_tempering.medians\[en-ru\] = 0.0 must be a finite number > 0"):
        Calibration.load(tmp_path / "broken.json")


def test_the_cross_fitted_choice_drops_a_sigma_that_is_noise_and_keeps_one_that_is_not(noise_sigma):
    dev, _, calibration = noise_sigma
    chosen, report = choose_sigma_weight(dev, "hts", calibration, SIGNED, BOUNDS)
    assert report["chosen"] == 0.0 and report["weights"]["0.0"] < report["weights"]["1.0"]
    assert chosen.sigma_tempering.weight == 0.0 and chosen.selected == calibration.selected
    informative = mqm_like(2, 2500, informative=True)
    fitted, _ = fit_calibration(informative, "hts", settings=SIGNED)
    kept, report = choose_sigma_weight(informative, "hts", fitted, SIGNED, BOUNDS)
    assert report["chosen"] == 1.0 and report["weights"]["1.0"] < report["weights"]["0.0"] - 0.05
    assert kept.sigma_tempering.is_identity
    # the model's sigma as is: the identity tempering only records the choice
    assert kept.served.to_dict() == fitted.served.to_dict()
    # one weight, or no sigma of its own: nothing to choose
    assert choose_sigma_weight(dev, "hts", calibration, dataclasses.replace(SIGNED, sigma_weights=(1.0,)), BOUNDS) == (calibration, {})
    point, _ = fit_calibration(dev, "point", settings=SIGNED)
    assert choose_sigma_weight(dev, "point", point, SIGNED, BOUNDS) == (point, {})


def test_a_pinned_weight_serves_what_the_grid_would_have_chosen_without_cross_fitting(noise_sigma, monkeypatch):
    """``evaluate.sigma_weights: [0]``: the same calibration as the grid's choice of 0 (every array of
    the saved file), with nothing cross-fitted; the record says the weight was pinned."""
    import uamt.model_evaluation as model_evaluation

    dev, _, calibration = noise_sigma
    chosen, report = choose_sigma_weight(dev, "hts", calibration, SIGNED, BOUNDS)
    assert report["chosen"] == 0.0
    monkeypatch.setattr(model_evaluation, "cross_fitted_rows", lambda *a, **k: pytest.fail("a pinned weight is not cross-fitted"))
    pinned, record = choose_sigma_weight(dev, "hts", calibration, dataclasses.replace(SIGNED, sigma_weights=(0.0,)), BOUNDS)
    assert record == {"weights": {}, "chosen": 0.0, "pinned": True}
    assert pinned.to_dict() == chosen.to_dict()
    # a pinned weight the grid would not choose is served all the same, to the pinned model only
    pins = dataclasses.replace(SIGNED, pinned_sigma_weights={"hts": 0.5})
    assert pins.sigma_weights_for("hts") == (0.5,) and pins.sigma_weights_for("kl") == pins.sigma_weights_for(None) == (0.0, 1.0)
    half, record = choose_sigma_weight(dev, "hts", calibration, pins, BOUNDS)
    assert record["chosen"] == 0.5 and half.sigma_tempering.weight == 0.5
    with pytest.raises(ValueError, match=r"pinned_sigma_weights.hts=1.5 not supported; pin a weight in \[0, 1\]"):
        EvaluationSettings(pinned_sigma_weights={"hts": 1.5})


def test_an_unseen_weight_tempers_only_rows_of_pairs_without_a_median():
    tempering = SigmaTempering.fit([1.0, 4.0, 9.0, 16.0], ["a", "a", "b", "b"], 0.0, unseen_weight=1.0)
    assert tempering.unseen == 1.0 and not tempering.is_identity
    lp = np.array(["a", "b", "new", GLOBAL], dtype=object)
    # a, b: their medians (weight 0); a new pair and GLOBAL: the model's sigma (weight 1)
    assert tempering.apply([4.0, 9.0, 3.0, 7.0], lp).tolist() == [2.5, 12.5, 3.0, 7.0]
    assert tempering.apply([3.0], None).tolist() == [3.0]
    half = tempering.with_unseen_weight(0.5)
    np.testing.assert_allclose(half.apply([4.0, 4.0], np.array(["a", "new"], dtype=object)), [2.5, np.sqrt(6.5 * 4.0)])
    assert tempering.with_unseen_weight(None).apply([3.0], None).tolist() == [6.5]
    assert SigmaTempering.from_dict(json.loads(json.dumps(tempering.to_dict()))) == tempering
    assert "unseen_weight" not in SigmaTempering.fit([1.0], ["a"], 0.5).to_dict()  # files before it read the same
    with pytest.raises(ValueError, match=r"unseen_weight = 2.0 must be in \[0, 1\]"):
        tempering.with_unseen_weight(2.0)
    with pytest.raises(ValueError, match=r"unseen_sigma_margin=1.5 must be in \[0, 1\)"):
        EvaluationSettings(unseen_sigma_margin=1.5)


def served_at_weight_zero(dev: pd.DataFrame, settings: EvaluationSettings) -> Calibration:
    """``dev``'s calibration serving σ weight 0 in domain (as the calibrate stage serves HTS), its
    global fallback fitted as an unseen row is tempered."""
    lp = dev["lp"].to_numpy(dtype=object)
    tempering = SigmaTempering.fit(dev["sigma"], lp, 0.0)
    fitted, _ = fit_calibration(tempering.applied(dev), None, settings=settings)
    calibration = with_sigma_tempering(fitted, tempering)
    refit_global_fallback(calibration, dev, settings)
    return attach_distribution(calibration, dev, None, settings, BOUNDS)


@pytest.mark.parametrize("informative", [True, False])
def test_unseen_pairs_take_their_own_sigma_weight_where_held_out_pairs_pay_for_it(informative):
    """In domain σ has weight 0; on LPs held out of the fit, a σ that carries the error scale wins
    the held-out CRPS by far and is served to unseen rows only, a σ that is noise does not win by
    the margin and unseen rows keep weight 0.  A held-out LP is tempered as unseen although the
    tempering kept its median."""
    settings = dataclasses.replace(SIGNED, unseen_sigma_margin=0.01)
    dev = mqm_like(3, 2000, informative)
    calibration = served_at_weight_zero(dev, settings)
    tables = {lp: mqm_like(4 + k, 1500, informative) for k, lp in enumerate(("en-ru", "zh-en"))}
    served, fit, record = choose_unseen_sigma_weight(tables, None, calibration, dev, settings, BOUNDS)
    weights = record["weights"]
    assert record["in_domain"] == 0.0 and record["margin"] == 0.01 and set(record["per_lp"]["1.0"]) == {"en-ru", "zh-en"}
    probe = mqm_like(9, 600, informative)
    mu, sigma, lp = probe["mu"].to_numpy(), probe["sigma"].to_numpy(), probe["lp"].to_numpy(dtype=object)
    new = np.full(len(probe), "new-pair", dtype=object)
    # what a known LP is served never moves
    np.testing.assert_array_equal(served.interval(mu, sigma, 0.9, lp), calibration.interval(mu, sigma, 0.9, lp))
    if informative:
        assert record["chosen"] == 1.0 and weights["1.0"] < 0.97 * weights["0.0"]
        assert served.sigma_tempering.unseen_weight == 1.0 and served.below_top.sigma_tempering.unseen_weight == 1.0
        assert not np.allclose(served.interval(mu, sigma, 0.9, new)[1], calibration.interval(mu, sigma, 0.9, new)[1])
        strict = dataclasses.replace(settings, unseen_sigma_margin=0.9)
        assert choose_unseen_sigma_weight(tables, None, calibration, dev, strict, BOUNDS)[2]["chosen"] == 0.0
    else:
        assert record["chosen"] == 0.0 and served is calibration
    held = fit.calibrations["en-ru"]
    assert "en-ru" not in held.known_lps and "en-ru" in held.sigma_tempering.medians
    rows = probe["lp"].to_numpy(dtype=object) == "en-ru"
    np.testing.assert_array_equal(
        held.interval(mu[rows], sigma[rows], 0.9, lp[rows]), held.interval(mu[rows], sigma[rows], 0.9, new[rows])
    )
    assert choose_unseen_sigma_weight(tables, None, calibration, dev, dataclasses.replace(settings, unseen_sigma_margin=None), BOUNDS)[2] == {}
    # one weight pinned: unseen rows take it, nothing is tried, the record says so
    single = dataclasses.replace(settings, sigma_weights=(0.0,))
    kept, _, record = choose_unseen_sigma_weight(tables, None, calibration, dev, single, BOUNDS)
    assert kept is calibration and record == {"weights": {}, "chosen": 0.0, "in_domain": 0.0, "pinned": True}


@pytest.mark.parametrize("weights", [(0.0,), (0.0, 0.0), (0.0, 1.5)])
def test_the_recheck_grid_refuses_fewer_than_two_distinct_weights_in_range(weights):
    from uamt.experiments.sigma_weights import SigmaWeightSettings

    with pytest.raises(ValueError, match=r"weights=\[.*\] not supported; choose at least two distinct weights in \[0, 1\]"):
        SigmaWeightSettings(weights=weights)
    assert SigmaWeightSettings(weights=(0.0, 1.0)).weights == (0.0, 1.0)
