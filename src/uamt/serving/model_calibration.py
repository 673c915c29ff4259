"""A model's dev-fitted calibration, applied to new predictions (pipeline, pyfunc, CLI, REST).

The calibration is what :func:`uamt.uncertainty.evaluate_predictions` fits on dev (its
``calibration`` block): a :class:`~uamt.uncertainty.Standardizer` (z-scores on dev), an
:class:`~uamt.uncertainty.AffineVarianceCalibrator` (sigma^2 -> alpha sigma^2 + beta in z units),
a :class:`~uamt.uncertainty.FixedVarianceCalibrator` (for the point estimate) and, where dev
sigma > 0, a :class:`~uamt.uncertainty.ConformalCalibrator`.  Applying it maps raw model output
(score scale of the training data) to calibrated mu and sigma on the human scale of the dev data.

A reference-based model also carries ``reference_factors``: for k = 2, 3, ... references and per
language pair, how much smaller (or larger) the squared error of predictions averaged over k
references (:mod:`uamt.serving.multi_reference`) was than that of single-reference predictions *on the same dev
rows*; a row scored against n references gets its calibrated variance multiplied by the factor of
the largest fitted k <= n (1 where none was fitted, e.g. an LP whose dev set has one reference).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import UamtError
from uamt.uncertainty import (
    GLOBAL,
    AffineVarianceCalibrator,
    ConformalCalibrator,
    EvaluationSettings,
    FixedVarianceCalibrator,
    Standardizer,
    gaussian_interval,
    probit,
    translation_risk,
)
from uamt.uncertainty.atom import TopAtom
from uamt.uncertainty.candidates import candidate_from_dict
from uamt.uncertainty.isotonic import IsotonicDistribution
from uamt.uncertainty.rearrangement import grid_of, in_mu_order
from uamt.uncertainty.served import intervals_at, served_risk
from uamt.uncertainty.tempering import SigmaTempering

INTERVAL_MODES = ("gaussian", "conformal")
#: Quantile levels the served standard deviation of a conformal distribution is read from.
SD_LEVELS = 100


@dataclass
class Calibration:
    """Fitted calibrators for one model (``fixed=True``: the point estimate's fixed variance)."""

    standardizer: Standardizer
    affine: AffineVarianceCalibrator
    fixed_variance: FixedVarianceCalibrator
    conformal: ConformalCalibrator | None
    fixed: bool = False
    #: k -> {lp or GLOBAL: variance factor of predictions averaged over k references}.
    reference_factors: dict[int, dict[str, float]] = field(default_factory=dict)
    #: The candidate the calibration rule selected (:mod:`uamt.uncertainty.candidates`) and its fit;
    #: None = the papers' affine fit (``affine``), as in files written before candidates existed.
    selected: str = "affine_ece"
    served: Any = None
    #: Factor (>= 1) on the calibrated sigma of rows whose LP has no calibration of its own.
    unseen_lp_sigma_factor: float = 1.0
    #: The splits whose rows it was fitted on (``evaluate.calibration_splits`` less the model's own
    #: training splits); files written before the setting existed were fitted on dev.
    calibrated_on: tuple[str, ...] = ("dev",)
    #: The point mass at the top of the scale (:mod:`uamt.uncertainty.atom`) and the calibration of
    #: the rows below it, which together are the served distribution; None (files written before it,
    #: ``evaluate.top_atom: false``): this calibration alone, clipped to the scale.
    top_atom: TopAtom | None = None
    below_top: Calibration | None = None
    #: Isotonic distributional regression of the human score on this calibration's served mu
    #: (:mod:`uamt.uncertainty.isotonic`, ``evaluate.distribution: isotonic``): where set, it is the
    #: served distribution (its own point masses, so no ``top_atom``), widened around mu by the same
    #: reference and unseen-LP factors.
    isotonic: IsotonicDistribution | None = None
    #: Keys of the fit left without a calibration of their own for having too few rows (a user's
    #: campaign under ``calibrate_campaigns.min_rows``, :mod:`uamt.campaigns`): ``{"min_rows": m,
    #: "keys": {key: rows}}``, so a request naming one is told why; empty (and not written) when none.
    too_few_rows: dict[str, Any] = field(default_factory=dict)
    #: σ's weight, chosen by the calibrate stage (:mod:`uamt.uncertainty.tempering`): the model's σ
    #: is tempered towards its LP's median before anything here reads it (the part below a point
    #: mass at the top holds the same); None (files written before it): σ as the model gave it.
    sigma_tempering: SigmaTempering | None = None
    #: lp -> the raw mu (:data:`~uamt.uncertainty.rearrangement.GRID_PERCENTILES` of its calibration
    #: rows) on which every interval bound and risk is rearranged in mu
    #: (:mod:`uamt.uncertainty.rearrangement`, ``evaluate.rearrange_in_mu``; set only where σ has no
    #: weight); empty (files written before it): answers as the calibrators give them.
    rearrangement_mu: dict[str, list[float]] = field(default_factory=dict)
    #: Where the served risk reads the CDF on the score's lattice (:func:`~uamt.uncertainty.served.lattice_threshold`,
    #: ``{"step": s, "offset": δ}``), chosen by the calibrate stage
    #: (:func:`uamt.model_evaluation.choose_risk_lattice`); empty (files written before it, or a
    #: continuous scale): the CDF at the threshold itself.  Only the risk reads it: the intervals, the
    #: CRPS and the randomised PIT read the CDF as it is.
    risk_lattice: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_result(cls, calibration: dict[str, Any], fixed: bool = False) -> Calibration:
        """Build from the ``calibration`` block of ``evaluate_predictions`` (fitted with a dev set)."""
        try:
            return cls(
                standardizer=Standardizer.from_dict(calibration["standardizer"]),
                affine=AffineVarianceCalibrator.from_dict(calibration["affine_variance"]),
                fixed_variance=FixedVarianceCalibrator.from_dict(calibration["fixed_variance"]),
                conformal=(
                    ConformalCalibrator.from_dict(calibration["conformal"])
                    if calibration.get("conformal")
                    else None
                ),
                fixed=fixed,
                selected=calibration.get("selected") or "affine_ece",
                served=candidate_from_dict(calibration.get("candidates"), calibration.get("selected")),
            )
        except KeyError as exc:
            raise UamtError(f"calibration is missing {exc.args[0]!r}: was it fitted with a dev set?") from exc

    @classmethod
    def fit(
        cls, dev_table: pd.DataFrame, method: str | None = None, settings: EvaluationSettings | None = None
    ) -> Calibration:
        """Fit on dev predictions (:func:`fit_calibration`; never on test)."""
        return fit_calibration(dev_table, method, settings=settings)[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "standardizer": self.standardizer.to_dict(),
            "affine_variance": self.affine.to_dict(),
            "fixed_variance": self.fixed_variance.to_dict(),
            "conformal": self.conformal.to_dict() if self.conformal is not None else None,
            "fixed": self.fixed,
            "selected": self.selected,
            "candidates": {} if self.served is None else {self.selected: self.served.to_dict()},
            "reference_factors": {str(k): dict(f) for k, f in sorted(self.reference_factors.items())},
            "unseen_lp_sigma_factor": self.unseen_lp_sigma_factor,
            "calibrated_on": list(self.calibrated_on),
            "top_atom": None if self.top_atom is None else self.top_atom.to_dict(),
            "below_top": None if self.below_top is None else self.below_top.to_dict(),
            "isotonic": None if self.isotonic is None else self.isotonic.to_dict(),
            # only where some key is left out, so a file without any keeps its bytes
            **({"too_few_rows": self.too_few_rows} if self.too_few_rows else {}),
            **({"sigma_tempering": self.sigma_tempering.to_dict()} if self.sigma_tempering is not None else {}),
            **({"rearrangement_mu": {lp: list(g) for lp, g in sorted(self.rearrangement_mu.items())}} if self.rearrangement_mu else {}),
            **({"risk_lattice": dict(self.risk_lattice)} if self.risk_lattice else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        calibration = cls.from_result(data, fixed=bool(data.get("fixed", False)))
        try:
            calibration.reference_factors = {
                int(k): {str(lp): float(v) for lp, v in factors.items()}
                for k, factors in (data.get("reference_factors") or {}).items()
            }
        except (AttributeError, TypeError, ValueError) as exc:
            raise UamtError(f"calibration: malformed reference_factors ({exc})") from exc
        try:
            # Files written before the factor existed read as 1 (no widening), as they behaved.
            calibration.unseen_lp_sigma_factor = float(data.get("unseen_lp_sigma_factor", 1.0))
        except (TypeError, ValueError) as exc:
            raise UamtError(f"calibration: malformed unseen_lp_sigma_factor ({exc})") from exc
        splits = data.get("calibrated_on", ["dev"])
        if not isinstance(splits, list) or not splits or not all(isinstance(s, str) for s in splits):
            raise UamtError(f"calibration: calibrated_on must be a non-empty list of split names, got {splits!r}")
        calibration.calibrated_on = tuple(splits)
        if (data.get("top_atom") is None) != (data.get("below_top") is None):
            raise UamtError("calibration: top_atom and below_top come together (one of them is missing)")
        if data.get("top_atom") is not None:
            calibration.top_atom = TopAtom.from_dict(data["top_atom"])
            calibration.below_top = Calibration.from_dict(data["below_top"])
        if data.get("isotonic") is not None:
            if calibration.top_atom is not None:
                raise UamtError("calibration: isotonic and top_atom are two served distributions; a file holds one")
            calibration.isotonic = IsotonicDistribution.from_dict(data["isotonic"])
        few = data.get("too_few_rows") or {}
        try:
            calibration.too_few_rows = (
                {"min_rows": int(few["min_rows"]), "keys": {str(k): int(n) for k, n in few["keys"].items()}} if few else {}
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise UamtError(f"calibration: malformed too_few_rows ({type(exc).__name__}: {exc})") from exc
        if data.get("sigma_tempering") is not None:
            try:
                calibration.sigma_tempering = SigmaTempering.from_dict(data["sigma_tempering"])
            except ValueError as exc:
                raise UamtError(f"calibration: {exc}") from exc
        grids = data.get("rearrangement_mu") or {}
        if not isinstance(grids, dict) or not all(isinstance(g, list) for g in grids.values()):
            raise UamtError(f"calibration: rearrangement_mu must map each lp to a list of mu, got {type(grids).__name__}")
        calibration.rearrangement_mu = {str(lp): [float(v) for v in g] for lp, g in grids.items()}
        calibration.risk_lattice = checked_risk_lattice(data.get("risk_lattice") or {})
        return calibration

    def save(self, path: str | Path) -> None:
        from uamt.uncertainty import write_json_atomic

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read and check a calibration file (UamtError naming ``path`` when it is unusable)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UamtError(f"{path}: cannot read calibration ({exc})") from exc
        if not isinstance(data, dict):
            raise UamtError(f"{path}: calibration must be a JSON object, got {type(data).__name__}")
        try:
            calibration = cls.from_dict(data)
        except UamtError as exc:
            raise UamtError(f"{path}: {exc}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UamtError(f"{path}: malformed calibration ({type(exc).__name__}: {exc})") from None
        problem = calibration.problem()
        if problem:
            raise UamtError(f"{path}: {problem}; the calibration is corrupt: re-run the calibrate stage")
        return calibration

    #: Per block: parameters that must be > 0, >= 0 and finite; conformal thresholds (``q@<level>``)
    #: may be +inf (too few calibration rows for that level) but never NaN or negative.
    _RULES = {
        "standardizer": {"positive": ("human_std", "pred_std"), "finite": ("human_mean", "pred_mean")},
        "affine_variance": {"nonnegative": ("alpha", "var_floor"), "finite": ("beta",)},
        "fixed_variance": {"positive": ("var",)},
        "conformal": {},
    }

    def problem(self) -> str | None:
        """What makes the fitted parameters unusable (NaN, a negative or zero std, ...), or None."""
        blocks = {
            "standardizer": self.standardizer,
            "affine_variance": self.affine,
            "fixed_variance": self.fixed_variance,
            "conformal": self.conformal,
            f"candidates.{self.selected}": self.served,
        }
        for block, calibrator in blocks.items():
            if calibrator is None:
                continue
            if calibrator.global_params is None:
                return f"{block} is not fitted"
            conformal = isinstance(calibrator, ConformalCalibrator)
            rules = self._RULES.get(block) or self._RULES["conformal" if conformal else "affine_variance"]
            required = (*rules.get("positive", ()), *rules.get("nonnegative", ()), *rules.get("finite", ()))
            for group, params in (("global", calibrator.global_params), *calibrator.lp_params.items()):
                for key in required:
                    if key not in params:
                        return f"{block}[{group}] is missing {key!r}"
                for key, value in params.items():
                    where = f"{block}[{group}].{key} = {value!r}"
                    conformal_threshold = conformal and "q@" in key
                    # signed conformal bounds: a lower one may be -inf, an upper one +inf, either sign
                    signed_bound = conformal and (("lo@" in key and value < 0) or ("hi@" in key and value > 0))
                    if not isinstance(value, (int, float)) or math.isnan(value):
                        return f"{where} is not a number"
                    if math.isinf(value) and not ((conformal_threshold and value > 0) or signed_bound):
                        return f"{where} is not finite"
                    if key in rules.get("positive", ()) and not value > 0:
                        return f"{where} must be > 0"
                    if (key in rules.get("nonnegative", ()) or conformal_threshold) and value < 0:
                        return f"{where} must be >= 0"
        for k, factors in self.reference_factors.items():
            for lp, factor in factors.items():
                if not (math.isfinite(factor) and factor > 0):
                    return f"reference_factors[{k}][{lp}] = {factor!r} must be a finite number > 0"
        factor = self.unseen_lp_sigma_factor
        if not (math.isfinite(factor) and factor >= 1):
            return f"unseen_lp_sigma_factor = {factor!r} must be a finite number >= 1"
        if self.sigma_tempering is not None and (problem := self.sigma_tempering.problem()):
            return problem
        for lp, grid in self.rearrangement_mu.items():
            values = np.asarray(grid, dtype=float)
            if values.size < 2 or not np.all(np.isfinite(values)) or np.any(np.diff(values) < 0):
                return f"rearrangement_mu[{lp}] must be at least two finite, non-decreasing mu"
        if self.top_atom is not None:
            problem = self.top_atom.problem() or self.below_top.problem()
            if problem:
                return problem if problem.startswith("top_atom") else f"below_top: {problem}"
        if self.isotonic is not None:
            return self.isotonic.problem()
        return None

    @property
    def known_lps(self) -> list[str]:
        """Language pairs with a calibration of their own (those of the dev data)."""
        return sorted(self.standardizer.lp_params)

    def unseen_lps(self, lp) -> list[str]:
        """The distinct LPs in ``lp`` (None, a string or shape [n]) without a calibration of their own."""
        if lp is None:
            return []
        names = {lp} if isinstance(lp, str) else set(np.asarray(lp, dtype=object).tolist())
        return sorted(str(name) for name in names - set(self.known_lps) - {GLOBAL})

    def _unseen_scale(self, lp, n: int) -> np.ndarray:
        """Per-row factor on the calibrated sigma: ``unseen_lp_sigma_factor`` on unseen LPs, else 1."""
        scale = np.ones(n)
        if lp is None or self.unseen_lp_sigma_factor == 1.0:
            return scale
        lps = np.full(n, lp, dtype=object) if isinstance(lp, str) else np.asarray(lp, dtype=object)
        scale[np.isin(lps, self.unseen_lps(lps))] = self.unseen_lp_sigma_factor
        return scale

    def reference_scale(self, lp, n_refs) -> np.ndarray:
        """Per-row factor on the calibrated sigma for rows that averaged ``n_refs`` references.

        For each row, the factor of the largest fitted k <= n_refs for its LP (``GLOBAL`` when
        ``lp`` is None), square-rooted (the factors are on variances); 1 where none was fitted.
        """
        n_refs = np.atleast_1d(np.asarray(n_refs, dtype=int))
        n = n_refs.size
        lps = np.full(n, GLOBAL, dtype=object) if lp is None else np.asarray(lp, dtype=object)
        if lps.shape != (n,):
            raise UamtError(f"lp and n_refs must have one entry per row ({n})")
        scale = np.ones(n)
        for k in sorted(self.reference_factors):
            factors = self.reference_factors[k]
            for i in np.flatnonzero(n_refs >= k):
                factor = factors.get(str(lps[i]))
                if factor is not None:
                    scale[i] = math.sqrt(factor)
        return scale

    def _seen_or_global(self, lp):
        """``lp`` (None, a string or shape [n]) with every LP the calibration has no parameters of
        its own for replaced by :data:`GLOBAL`: such a row is tempered as an unseen row is, even
        where the tempering kept a median of its LP (refitted on rows without it)."""
        if lp is None:
            return None
        known = set(self.known_lps)
        if isinstance(lp, str):
            return lp if lp in known else GLOBAL
        names = np.asarray(lp, dtype=object)
        return np.where(pd.Series(names.ravel(), dtype=object).astype(str).isin(known).to_numpy().reshape(names.shape), names, GLOBAL)

    def _z(self, mu, sigma, lp):
        mu = np.asarray(mu, dtype=float)
        if self.fixed:
            sigma = np.ones_like(mu)
        elif self.sigma_tempering is not None:
            sigma = self.sigma_tempering.apply(np.broadcast_to(np.asarray(sigma, dtype=float), mu.shape), self._seen_or_global(lp))
        mu_z, sigma_z = self.standardizer.transform_predictions(mu, np.asarray(sigma, dtype=float), lp)
        return mu_z, sigma_z

    @property
    def is_gaussian(self) -> bool:
        """Whether the served distribution is the Gaussian N(mu, sigma^2) (fixed or affine variance);
        else it is a conformal distribution, or has a point mass at the top, or is the isotonic one,
        with its own intervals and CDF."""
        return (
            self.top_atom is None
            and self.isotonic is None
            and not self._serves_conformal
        )

    @property
    def _serves_conformal(self) -> bool:
        """Whether the served candidate is a conformal one (not overridden by a fixed variance)."""
        return isinstance(self.served, ConformalCalibrator) and not self.fixed

    @property
    def takes_row_levels(self) -> bool:
        """Whether :meth:`interval` takes one level per row (shape [n]): a conformal served
        distribution, or one with a point mass at the top (its part below the top is asked at each
        row's own level); a Gaussian or the isotonic one takes one level for every row."""
        return self.isotonic is None and (self.top_atom is not None or self._serves_conformal)

    @property
    def has_interior_atoms(self) -> bool:
        """Whether the served distribution has point masses inside the scale (the isotonic one: at
        every score it was fitted at), where a score is measured by the randomised PIT
        (:func:`uamt.uncertainty.served.randomised_shares`), not by the closed interval."""
        return self.isotonic is not None

    def center(self, mu, sigma, lp=None, n_refs=None) -> np.ndarray:
        """The served mu on the human scale, shape [n] (the calibration does not move it with
        ``n_refs``; the argument keeps the protocol's signature)."""
        mu_z, sigma_z = self._z(mu, sigma, lp)
        return self.standardizer.to_human_scale(mu_z, np.zeros_like(mu_z), lp)[0]

    def _gaussian(self, mu, sigma, lp, n_refs) -> tuple[np.ndarray, np.ndarray]:
        mu_z, sigma_z = self._z(mu, sigma, lp)
        if self.fixed:
            cal_sigma_z = self.fixed_variance.transform(mu_z, lp=lp)
        else:
            cal_sigma_z = (self.served or self.affine).transform(mu_z, sigma_z, lp=lp)
        cal_sigma_z = cal_sigma_z * self._widen(lp, n_refs, len(mu_z))
        return self.standardizer.to_human_scale(mu_z, cal_sigma_z, lp)

    def apply(self, mu, sigma, lp=None, n_refs=None) -> tuple[np.ndarray, np.ndarray]:
        """Served ``(mu, sigma)`` on the human scale, each shape [n].

        ``sigma`` (in and out) is a standard deviation; ``n_refs`` (shape [n], optional): how many
        references each row's prediction averaged.  For a Gaussian served distribution the output
        sigma is its sigma; for a conformal one it is the standard deviation of the served
        distribution itself (:meth:`served_sd`), not a Gaussian stand-in.
        """
        if self.is_gaussian:
            return self._gaussian(mu, sigma, lp, n_refs)
        center = self.center(mu, sigma, lp, n_refs)
        return center, self.served_sd(mu, sigma, lp, n_refs)

    def served_sd(self, mu, sigma, lp=None, n_refs=None, n_quantiles: int | None = None) -> np.ndarray:
        """Standard deviation of the served distribution per row, shape [n], from its quantiles at the
        mid-point levels :math:`p_k = (k - 1/2)/K` (K = ``n_quantiles``, default :data:`SD_LEVELS`);
        a level beyond the calibration's reach takes the row's outermost finite quantile
        (:func:`uamt.uncertainty.served.clamp_tails`), as in the served CRPS."""
        from uamt.uncertainty.served import clamp_tails

        k = int(n_quantiles or SD_LEVELS)
        mu = np.asarray(mu, dtype=float)
        quantiles = np.empty((mu.size, k))
        probs = (np.arange(k) + 0.5) / k
        levels = [1.0 - 2.0 * probs[j] for j in range(k // 2)]
        asked = intervals_at(self, mu, sigma, levels, lp, "conformal", n_refs=n_refs)
        for j, level in enumerate(levels):
            quantiles[:, j], quantiles[:, k - 1 - j] = asked[level]
        return clamp_tails(quantiles).std(axis=1)

    def human_std(self, lp, n: int) -> np.ndarray:
        """Per row, shape [n]: the dev standard deviation of human scores of the row's LP (its
        global fallback for an LP without its own fit) -- one z unit in human-score units."""
        return self.standardizer.to_human_scale(np.zeros(n), np.ones(n), lp)[1]

    def raw_sigma_on_human_scale(self, mu, sigma, lp=None) -> np.ndarray:
        """The model's raw sigma mapped to the human scale by the standardiser alone (no
        calibration), shape [n]: what a method announces before any calibration."""
        mu_z, sigma_z = self.standardizer.transform_predictions(
            np.asarray(mu, dtype=float), np.asarray(sigma, dtype=float), lp
        )
        return self.standardizer.to_human_scale(mu_z, sigma_z, lp)[1]

    def _widen(self, lp, n_refs, n: int) -> np.ndarray:
        """Per-row factor on the calibrated spread: reference factors times the unseen-LP factor."""
        widen = self._unseen_scale(lp, n)
        if n_refs is not None and self.reference_factors:
            widen = widen * self.reference_scale(lp, n_refs)
        return widen

    def _in_mu_order(self, answer, values, mu, sigma, lp, n_refs, level, increasing: bool) -> np.ndarray:
        """``values`` (shape [n]) rearranged in mu within each LP with a grid (:attr:`rearrangement_mu`);
        as given where there is none.  ``answer(mu, sigma, lp, n_refs, level)`` the same answer of
        grid rows at one ``level`` (:func:`uamt.uncertainty.rearrangement.in_mu_order`)."""
        if not self.rearrangement_mu or lp is None:
            return values
        mu = np.asarray(mu, dtype=float)
        n = mu.size
        lps = np.full(n, lp, dtype=object) if isinstance(lp, str) else np.asarray(lp, dtype=object)
        refs = None if n_refs is None else np.broadcast_to(np.asarray(n_refs), (n,))
        return in_mu_order(
            answer, values, mu, np.broadcast_to(np.asarray(sigma, dtype=float), (n,)), lps, refs,
            np.broadcast_to(np.asarray(level, dtype=float), (n,)), self.rearrangement_mu, increasing,
        )

    def interval(self, mu, sigma, gamma: float, lp=None, mode: str = "gaussian", n_refs=None):
        """Central interval at ``gamma`` on the human scale: Gaussian-calibrated or split-conformal
        (with a point mass at the top, the served mixture's, whatever ``mode``).  ``gamma``: one
        level, or, where the served distribution is a conformal one, one per row (shape [n]).
        Each bound is rearranged in mu where the calibration holds a grid (:attr:`rearrangement_mu`)."""
        lower, upper = self._interval(mu, sigma, gamma, lp, mode, n_refs)
        if not self.rearrangement_mu:
            return lower, upper

        # Both bounds from one call: the two sides ask the same grid rows (in_mu_order stacks them alike).
        asked: list[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, np.ndarray]]] = []

        def bound(side: int):
            def answer(m, s, grid_lp, refs, level):
                query = (m, s, grid_lp, refs, level)
                if not asked or not all(_same(a, b) for a, b in zip(asked[0][0], query, strict=True)):
                    asked[:] = [(query, self._interval(m, s, _one_or_each(level), grid_lp, mode, refs))]
                return asked[0][1][side]

            return answer

        return tuple(
            self._in_mu_order(bound(side), values, mu, sigma, lp, n_refs, gamma, increasing=True)
            for side, values in enumerate((lower, upper))
        )

    def _interval(self, mu, sigma, gamma, lp, mode: str, n_refs):
        """:meth:`interval` as the calibrators give it (not rearranged)."""
        if mode not in INTERVAL_MODES:
            raise ValueError(f"interval={mode!r} not supported; choose from {sorted(INTERVAL_MODES)}")
        if self.isotonic is not None:
            center = self.center(mu, sigma, lp)
            low, high = self.isotonic.interval(center, lp, gamma)
            # Q = pivot + widen * (Q0 - pivot), as below, pivoting on mu clipped into the scores
            pivot = self.isotonic.clip_to_support(center, lp)
            widen = self._widen(lp, n_refs, center.size)
            unwidened = widen == 1.0  # exactly the scores the point masses sit on, not mu + (Q0 - mu)
            return (
                np.where(unwidened, low, pivot - (pivot - low) * widen),
                np.where(unwidened, high, pivot + (high - pivot) * widen),
            )
        if self.top_atom is not None:
            return self._mixture_interval(mu, sigma, gamma, lp, n_refs)
        served_conformal = self._serves_conformal
        if (mode == "gaussian" and not served_conformal) or self.fixed:
            cal_mu, cal_sigma = self._gaussian(mu, sigma, lp, n_refs)
            return gaussian_interval(cal_mu, cal_sigma, gamma)
        if self.conformal is None and not served_conformal:
            raise UamtError("this model has no conformal calibration (a dev sigma was 0)")
        mu_z, sigma_z = self._z(mu, sigma, lp)
        if served_conformal:  # the served distribution: its interval at any level (interpolated)
            low_z, high_z = self.served.interval_at(mu_z, sigma_z, gamma, lp)
        else:
            low_z, high_z = self.conformal.interval(mu_z, sigma_z, gamma, lp)
        # The reference and unseen-LP factors widen the calibrated distribution around mu (its output,
        # not the model's sigma: a conformal scale fitted with alpha ~ 0 would ignore the input).
        widen = self._widen(lp, n_refs, len(mu_z))
        low_z, high_z = mu_z - (mu_z - low_z) * widen, mu_z + (high_z - mu_z) * widen
        # A level beyond the calibration's reach is unbounded (a conformal bound of -inf / +inf): it
        # stays so on the human scale (the standardiser maps finite values only).
        unbounded_low, unbounded_high = np.isinf(low_z), np.isinf(high_z)
        low, _ = self.standardizer.to_human_scale(np.where(unbounded_low, mu_z, low_z), np.zeros_like(low_z), lp)
        high, _ = self.standardizer.to_human_scale(np.where(unbounded_high, mu_z, high_z), np.zeros_like(high_z), lp)
        return np.where(unbounded_low, -np.inf, low), np.where(unbounded_high, np.inf, high)

    def served_risk(self, mu, sigma, threshold, lp=None, n_refs=None) -> np.ndarray:
        """The risk users are served, :math:`P(Q \\le \\chi)`, shape [n]: :meth:`risk` read on the
        score's lattice where the calibration holds one (:attr:`risk_lattice`), else :meth:`risk`."""
        return served_risk(self, mu, sigma, threshold, lp, n_refs=n_refs)

    def risk(self, mu, sigma, threshold, lp=None, n_refs=None) -> np.ndarray:
        """P(Q <= threshold) under the served calibrated distribution (human scale), shape [n]: the
        same one the interval comes from (Gaussian, or the conformal |z| quantiles, or the mixture
        with a point mass at the top: :math:`(1 - \\pi) F_{<}(\\chi)` below the top, 1 from it on, or
        the isotonic CDF), rearranged in mu where the calibration holds a grid
        (:attr:`rearrangement_mu`).  ``threshold``: one :math:`\\chi` for every row, or one per row
        (shape [n]: the CDF at each row's own score in one call)."""
        risk = self._risk(mu, sigma, threshold, lp, n_refs)
        if not self.rearrangement_mu:
            return risk
        return self._in_mu_order(
            lambda m, s, grid_lp, refs, chi: self._risk(m, s, _one_or_each(chi), grid_lp, refs),
            risk, mu, sigma, lp, n_refs, threshold, increasing=False,
        )

    def _risk(self, mu, sigma, threshold, lp, n_refs) -> np.ndarray:
        """:meth:`risk` as the calibrators give it (not rearranged)."""
        mu = np.asarray(mu, dtype=float)
        chi = np.broadcast_to(np.asarray(threshold, dtype=float), mu.shape)
        if self.isotonic is not None:
            center = self.center(mu, sigma, lp)
            pivot = self.isotonic.clip_to_support(center, lp)  # as in interval()
            widen = self._widen(lp, n_refs, center.size)
            # unwidened rows read the threshold itself: mu + (chi - mu) rounds chi = 0^- to 0, and the
            # CDF just below a point mass is what the randomised PIT needs
            value = np.where(widen == 1.0, chi, pivot + (chi - pivot) / widen)
            return self.isotonic.cdf(center, lp, value)
        if self.top_atom is not None:
            pi = self.top_atom.probability(self.center(mu, sigma, lp), lp)
            below = np.asarray(self.below_top.risk(mu, sigma, chi, lp, n_refs=n_refs), dtype=float)
            return np.where(chi >= self.top_atom.value, 1.0, (1.0 - pi) * below)
        if self._serves_conformal:
            mu_z, sigma_z = self._z(mu, sigma, lp)
            chi_z = self.standardizer.transform_human(np.array(chi, dtype=float), lp)
            # As in interval(): Q = mu + widen * (Q0 - mu), so P(Q <= chi) = P(Q0 <= mu + (chi - mu) / widen).
            chi_z = mu_z + (chi_z - mu_z) / self._widen(lp, n_refs, len(mu_z))
            return self.served.risk(mu_z, sigma_z, chi_z, lp)
        cal_mu, cal_sigma = self._gaussian(mu, sigma, lp, n_refs)
        return translation_risk(cal_mu, cal_sigma, chi)

    def _mixture_interval(self, mu, sigma, gamma: float, lp, n_refs) -> tuple[np.ndarray, np.ndarray]:
        """Central interval of :math:`(1 - \\pi) F_{<} + \\pi\\,\\delta_{top}` (clipped at the top): its
        quantile at p is :math:`\\min(F_{<}^{-1}(p / (1 - \\pi)), top)` for :math:`p < 1 - \\pi`, else the top."""
        mu = np.asarray(mu, dtype=float)
        sigma = np.asarray(sigma, dtype=float)
        pi = self.top_atom.probability(self.center(mu, sigma, lp), lp)
        return (
            self._below_top_quantile(mu, sigma, lp, n_refs, (1.0 - gamma) / 2.0, pi),
            self._below_top_quantile(mu, sigma, lp, n_refs, (1.0 + gamma) / 2.0, pi),
        )

    def _below_top_quantile(self, mu, sigma, lp, n_refs, p: float, pi: np.ndarray) -> np.ndarray:
        """Per row, shape [n]: the mixture's quantile at level ``p`` (``pi`` the rows' extra top mass)."""
        top = self.top_atom.value
        inside = pi + p < 1.0
        level = np.where(inside, p / np.where(inside, 1.0 - pi, 1.0), np.inf)
        out = np.full(mu.size, top)
        lps = None if lp is None else (np.full(mu.size, lp, dtype=object) if isinstance(lp, str) else np.asarray(lp, dtype=object))
        refs = None if n_refs is None else np.broadcast_to(np.asarray(n_refs), mu.shape)
        if not inside.any():
            return out
        if not self.below_top.is_gaussian:  # a conformal distribution below: every row's own level in one call
            # Asked for every row (level 1 where the top's mass holds the quantile; each row's answer
            # is its own), so that the calls for the ~100 levels of a CRPS ask the same rows and the
            # conformal calibrator interpolates their knots once (MondrianConformalCalibrator._interpolated).
            gamma = np.minimum(np.abs(2.0 * level - 1.0), 1.0)
            lower, upper = self.below_top.interval(mu, sigma, gamma, lps, "conformal", n_refs=refs)
            out[inside] = np.where(level[inside] < 0.5, lower[inside], upper[inside])
            return np.minimum(out, top)
        # A Gaussian below (the fixed-variance point baseline): its quantile at each row's own level
        # in one pass.  pi interpolated in mu gives nearly every row its own level, and one interval
        # call per distinct level made the calibrate stage's cross-fits quadratic in the rows.
        cal_mu, cal_sigma = self.below_top._gaussian(
            mu[inside], sigma[inside], None if lps is None else lps[inside], None if refs is None else refs[inside]
        )
        out[inside] = cal_mu + cal_sigma * probit(level[inside])
        return np.minimum(out, top)


def _one_or_each(level: np.ndarray):
    """One level for every row where the rows share it (the scalar path every distribution takes),
    else the array: one per row."""
    level = np.asarray(level, dtype=float)
    return float(level[0]) if level.size and np.all(level == level[0]) else level


def _same(a, b) -> bool:
    """Whether two grid query arguments (arrays, or None for no reference counts) are equal."""
    return a is b if a is None or b is None else np.array_equal(a, b)


def with_top_atom(
    calibration: Calibration,
    table: pd.DataFrame,
    method: str | None,
    settings: EvaluationSettings,
    top: float,
    n_bins: int = 5,
    anchor=None,
) -> Calibration:
    """``calibration`` with a point mass at ``top`` (the top of the scale) fitted on its calibration rows.

    The distribution below the top is the same candidate refitted on the rows below it
    (:func:`refit_served`), widened by the same reference and unseen-LP factors; the top mass per
    LP x ``n_bins``-quantile bin of the served mu tops up what that distribution clips onto the top to the share of
    ``table``'s rows there (:class:`~uamt.uncertainty.atom.TopAtom`).  The served mu stays
    ``calibration``'s (fitted on every row).  ``anchor``: as :func:`refit_served`'s, for the refit
    below the top (called with ``part="below_top"``).
    """
    if method is not None:
        table = with_model_sigma(table, method)
    # the part below the top is not rearranged itself: the mixture is (:func:`with_rearrangement`)
    base = dataclasses.replace(calibration, top_atom=None, below_top=None, rearrangement_mu={})
    below_rows = table[table["human"].to_numpy(dtype=float) < top]
    below = refit_served(below_rows, None, base, settings, anchor, part="below_top")
    below.reference_factors = dict(calibration.reference_factors)
    below.unseen_lp_sigma_factor = calibration.unseen_lp_sigma_factor
    below.calibrated_on = calibration.calibrated_on
    mu, sigma = table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    clipped = 1.0 - np.asarray(below.risk(mu, sigma, float(np.nextafter(top, -np.inf)), lp), dtype=float)
    atom = TopAtom.fit(
        table["human"].to_numpy(dtype=float), base.center(mu, sigma, lp), lp, top,
        clipped=clipped, n_bins=n_bins, min_lp_rows=settings.min_lp_rows,
    )
    return dataclasses.replace(base, top_atom=atom, below_top=below)


def with_isotonic(calibration: Calibration, table: pd.DataFrame, method: str | None, settings: EvaluationSettings) -> Calibration:
    """``calibration`` serving the isotonic distribution (:class:`~uamt.uncertainty.isotonic.IsotonicDistribution`)
    fitted on its calibration rows ``table`` against its served mu (per LP; the global fallback
    against the mu a row of an unseen LP gets), with the risk thresholds among its thresholds.
    Replaces a point mass at the top (the isotonic distribution has its own)."""
    if method is not None:
        table = with_model_sigma(table, method)
    base = dataclasses.replace(calibration, top_atom=None, below_top=None, isotonic=None, rearrangement_mu={})
    mu, sigma = table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    isotonic = IsotonicDistribution.fit(
        table["human"].to_numpy(dtype=float), base.center(mu, sigma, lp), lp,
        keep_thresholds=settings.risk_thresholds, min_lp_rows=settings.min_lp_rows,
        global_center=base.center(mu, sigma, None),
    )
    return dataclasses.replace(base, isotonic=isotonic)


def attach_distribution(
    calibration: Calibration, table: pd.DataFrame, method: str | None, settings: EvaluationSettings, bounds
) -> Calibration:
    """The served distribution ``settings.distribution`` names on top of a fitted ``calibration``:
    ``isotonic`` (:func:`with_isotonic`) or the candidate itself, with a point mass at the top of
    the scale where ``settings.top_atom`` (:func:`with_top_atom`; needs the scale's ``bounds``)."""
    if settings.distribution == "isotonic":
        return with_isotonic(calibration, table, method, settings)
    if settings.top_atom and bounds is not None:
        calibration = with_top_atom(calibration, table, method, settings, bounds[1])
    return with_rearrangement(calibration, table, method, settings)


def sigma_has_no_weight(calibration: Calibration, table: pd.DataFrame) -> bool:
    """Whether the served distribution of a row of a known LP depends on its mu alone, not its σ:
    the fixed variance, σ tempered with weight 0, or one σ per LP in ``table`` (the point
    estimate's constant 1)."""
    if calibration.fixed or (calibration.sigma_tempering is not None and calibration.sigma_tempering.weight == 0.0):
        return True
    return bool(table.groupby(table["lp"].astype(str))["sigma"].nunique().le(1).all())


def with_rearrangement(calibration: Calibration, table: pd.DataFrame, method: str | None, settings: EvaluationSettings) -> Calibration:
    """``calibration`` with the grid its answers are rearranged in mu on (``settings.rearrange_in_mu``,
    :mod:`uamt.uncertainty.rearrangement`): per known LP with ``settings.min_lp_rows`` rows of
    ``table`` (its calibration rows), the :data:`~uamt.uncertainty.rearrangement.GRID_PERCENTILES`
    of their raw mu.  Only where σ has no weight (:func:`sigma_has_no_weight`), so that the
    rearrangement at one σ is the rearrangement of every row, and not for the isotonic
    distribution (monotone in mu by construction); otherwise, or with the setting off, without one."""
    if method is not None:
        table = with_model_sigma(table, method)
    grids: dict[str, list[float]] = {}
    if settings.rearrange_in_mu and calibration.isotonic is None and sigma_has_no_weight(calibration, table):
        known = set(calibration.known_lps)
        for lp, rows in table.groupby(table["lp"].astype(str)):
            if lp in known and len(rows) >= settings.min_lp_rows:
                grids[str(lp)] = grid_of(rows["mu"].to_numpy(dtype=float))
    return dataclasses.replace(calibration, rearrangement_mu=grids)


def is_fixed_variance(method: str) -> bool:
    """Whether the pipeline model ``method`` is calibrated with the fixed-variance Gaussian: its method
    (reference-based or QE) has no sigma of its own (``MethodSpec.fixed_variance``)."""
    from uamt.models.specs import is_fixed_variance as spec_has_no_sigma

    return spec_has_no_sigma(method)


def with_model_sigma(table: pd.DataFrame, method: str) -> pd.DataFrame:
    """The table ``evaluate_predictions`` reads: the point estimate's NaN sigma becomes a constant 1,
    which the affine calibration turns into a fitted constant variance."""
    if is_fixed_variance(method):
        table = table.assign(sigma=np.ones(len(table)))
    return table


def fit_calibration(
    dev_table: pd.DataFrame,
    method: str | None = None,
    *,
    settings: EvaluationSettings | None = None,
    source: str = "dev",
) -> tuple[Calibration, dict[str, Any]]:
    """Fit a model's :class:`Calibration` on its dev predictions (never on test).

    ``evaluate_predictions(dev, dev)`` fits the standardisation, the affine sigma^2 calibration, the
    fixed variance and the conformal thresholds on dev; :meth:`Calibration.from_result` keeps them.

    Parameters
    ----------
    dev_table : DataFrame
        Dev predictions: ``lp, human, mu, sigma`` (the predictions table of a model).
    method : str, optional
        Pipeline model name: the point estimate (:func:`is_fixed_variance`) gets sigma 1
        (:func:`with_model_sigma`) and the fixed-variance Gaussian.  None: ``sigma`` as is.
    settings : EvaluationSettings, optional
        The ``evaluate:`` section (default ``EvaluationSettings()``).
    source : str
        Names the table in error messages.

    Returns
    -------
    calibration : Calibration
    in_sample : dict
        The :func:`~uamt.uncertainty.evaluate_predictions` result on dev itself (its ``methods``
        hold the in-sample dev metrics).
    """
    from uamt.uncertainty import evaluate_predictions

    fixed = method is not None and is_fixed_variance(method)
    if method is not None:
        dev_table = with_model_sigma(dev_table, method)
    in_sample = evaluate_predictions(
        dev_table,
        dev_table,
        settings=settings if settings is not None else EvaluationSettings(),
        pred_source=source,
        dev_source=source,
        scope="served",  # the candidates' in-sample dev blocks and k-fold ECE are never read
    )
    calibration = Calibration.from_result(in_sample["calibration"], fixed=fixed)
    refit_global_fallback(calibration, dev_table, settings if settings is not None else EvaluationSettings())
    return calibration, in_sample


def checked_risk_lattice(lattice: dict[str, Any]) -> dict[str, float]:
    """A calibration file's ``risk_lattice``, checked: empty, or ``{"step": s, "offset": δ}`` with
    s > 0 and 0 <= δ < s (UamtError naming the field otherwise)."""
    if not lattice:
        return {}
    try:
        step, offset = float(lattice["step"]), float(lattice["offset"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UamtError(f"calibration: risk_lattice must be {{step, offset}}, got {lattice!r}") from exc
    if not (math.isfinite(step) and step > 0 and 0.0 <= offset < step):
        raise UamtError(f"calibration: risk_lattice step {step!r} must be > 0 and offset {offset!r} in [0, step)")
    return {"step": step, "offset": offset}


def refit_served(
    dev_table: pd.DataFrame,
    method: str | None,
    template: Calibration,
    settings: EvaluationSettings | None = None,
    anchor=None,
    part: str = "all",
) -> Calibration:
    """The calibration ``template`` serves, refitted on ``dev_table``: same candidate, nothing else.

    What :func:`fit_calibration` with the candidate pinned gives for everything that is served --
    the standardiser, the served candidate (or the fixed variance of the point estimate) and its
    global fallback (:func:`refit_global_fallback`) -- without the papers' affine ECE grid search
    and the candidate rule's cross-fitting, which only matter for choosing: about 5x faster, for
    the many refits of the cross-fitted dev metrics and the leave-one-LP-out widening.  The
    reference factors and the unseen-LP widening are not refitted (1 / none).  A template with a
    point mass at the top gets one refitted on the same rows (:func:`with_top_atom`), an isotonic
    one its isotonic distribution (:func:`with_isotonic`).  A template with a σ weight
    (:class:`~uamt.uncertainty.tempering.SigmaTempering`) has everything refitted on the tempered σ
    and keeps its weight and medians (the medians are a constant per LP, which the per-LP fit
    absorbs: they are not refitted on the rows).

    ``anchor``, if given, may change per-group parameters in place (:class:`uamt.campaigns.LPAnchor`
    puts each campaign on its LP's mu slope, or its LP's whole distribution shape):
    ``anchor.standardizer(standardizer, arrays, part)`` before anything is fitted on the rows it
    standardises, ``anchor.candidate(candidate, part)`` once the candidate is fitted; ``part`` is
    ``"all"``, or ``"below_top"`` for the distribution below a point mass at the top.
    """
    from uamt.uncertainty.candidates import fit_candidate, standardize
    from uamt.uncertainty.evaluate import prediction_arrays

    settings = settings if settings is not None else EvaluationSettings()
    if method is not None:
        dev_table = with_model_sigma(dev_table, method)
    tempering = None if template.fixed else template.sigma_tempering
    raw_table = dev_table  # the global fallback and the served distribution read the model's own σ
    if tempering is not None:
        dev_table = tempering.applied(dev_table)
    arrays = prediction_arrays(dev_table, "dev")
    common = {"per_lp": settings.per_lp, "min_lp_rows": settings.min_lp_rows}
    everything = np.ones(len(arrays), dtype=bool)
    standardizer, (human, mu_z, sigma_z), _ = standardize(
        arrays, everything, everything, common, mu_scaling=settings.mu_scaling
    )
    if anchor is not None:
        anchor.standardizer(standardizer, arrays, part)
        human = standardizer.transform_human(arrays.human, arrays.lp)
        mu_z, sigma_z = standardizer.transform_predictions(arrays.mu, arrays.sigma, arrays.lp)
    fixed_variance = FixedVarianceCalibrator(**common).fit(human, mu_z, lp=arrays.lp)
    served, affine = None, template.affine
    if not template.fixed:
        fitted = fit_candidate(
            template.selected, human, mu_z, sigma_z, arrays.lp, common=common,
            n_levels=settings.n_levels, ece_bound=settings.ece_bound,
        )
        if anchor is not None:
            anchor.candidate(fitted, part)
        if template.selected == "affine_ece":
            affine = fitted
        else:
            served = fitted
    calibration = Calibration(
        standardizer=standardizer,
        affine=affine,
        fixed_variance=fixed_variance,
        conformal=None,
        fixed=template.fixed,
        selected=template.selected,
        served=served,
        sigma_tempering=tempering,
    )
    refit_global_fallback(calibration, raw_table, settings)
    if template.isotonic is not None:
        calibration = with_isotonic(calibration, raw_table, None, settings)
    elif template.top_atom is not None:
        calibration = with_top_atom(
            calibration, raw_table, None, settings, template.top_atom.value, n_bins=template.top_atom.n_bins,
            anchor=anchor,
        )
    calibration = with_sigma_tempering(calibration, tempering)
    if template.rearrangement_mu and part == "all":  # the grid of these rows, as the template's was of its own
        calibration = with_rearrangement(calibration, raw_table, None, dataclasses.replace(settings, rearrange_in_mu=True))
    if part == "all":
        calibration.risk_lattice = dict(template.risk_lattice)
    return calibration


def with_sigma_tempering(calibration: Calibration, tempering: SigmaTempering | None) -> Calibration:
    """``calibration`` (fitted on σ tempered by ``tempering``) reading the model's own σ: the
    tempering set on it and on the part below a point mass at the top."""
    if tempering is None:
        return calibration
    out = dataclasses.replace(calibration, sigma_tempering=tempering)
    if out.below_top is not None:
        out.below_top = dataclasses.replace(out.below_top, sigma_tempering=tempering)
    return out


def with_unseen_sigma_weight(
    calibration: Calibration, weight: float, table: pd.DataFrame, method: str | None, settings: EvaluationSettings
) -> Calibration:
    """A copy of ``calibration`` (with a σ weight) whose rows of unseen pairs are tempered with
    ``weight`` (:attr:`~uamt.uncertainty.tempering.SigmaTempering.unseen_weight`; the in-domain
    weight: none of its own), its global fallback -- and the one below a point mass at the top --
    refitted on ``table``'s rows (its calibration rows, the model's own σ) tempered as an unseen
    row's.  Everything a known LP is served stays as it is."""
    if calibration.sigma_tempering is None or calibration.fixed:
        raise ValueError("an unseen-pair sigma weight needs a calibration with a sigma weight (sigma_tempering)")
    if method is not None:
        table = with_model_sigma(table, method)
    tempering = calibration.sigma_tempering
    tempering = tempering.with_unseen_weight(None if float(weight) == tempering.weight else float(weight))
    out = with_sigma_tempering(copy.deepcopy(calibration), tempering)
    refit_global_fallback(out, table, settings)
    if out.below_top is not None:
        refit_global_fallback(out.below_top, table[table["human"].to_numpy(dtype=float) < out.top_atom.value], settings)
    return out


def refit_global_fallback(calibration: Calibration, dev_table: pd.DataFrame, settings: EvaluationSettings) -> None:
    """Refit the served calibrator's global fallback in the units it is applied in.

    A row of an LP without a calibration of its own is standardised with the *global* standardiser
    (dev statistics of all LPs pooled, in human units: en-de paragraphs with their wide spread
    weigh in) and then calibrated with the candidate's global parameters.  Those are fitted on the
    pooled rows standardised *per LP*, another unit.  This refits them (the candidate fitted with
    ``per_lp=False``) on every dev row standardised the way an unseen LP's rows are, so the fallback
    covers in the units it serves.  ``dev_table``'s ``sigma`` is the model's own: a calibration with
    a σ weight tempers it as an unseen row's (the global median, the unseen weight), not as its LP's.
    The per-LP parameters are untouched; a fixed-variance calibration (the point estimate's) has no
    candidate and is left as is.
    """
    from uamt.uncertainty.candidates import fit_candidate

    if calibration.fixed or not calibration.known_lps:
        return
    human = calibration.standardizer.transform_human(dev_table["human"].to_numpy(dtype=float), None)
    mu_z, sigma_z = calibration._z(dev_table["mu"].to_numpy(dtype=float), dev_table["sigma"].to_numpy(dtype=float), None)
    fresh = fit_candidate(
        calibration.selected,
        human,
        mu_z,
        sigma_z,
        None,
        common={"per_lp": False, "min_lp_rows": settings.min_lp_rows},
        n_levels=settings.n_levels,
        ece_bound=settings.ece_bound,
    )
    target = calibration.served if calibration.served is not None else calibration.affine
    target.global_params = fresh.global_params
    if getattr(target, "variance", None) is not None:
        target.variance.global_params = fresh.variance.global_params


def load_calibrations(calibration_dir: str | Path, methods) -> dict[str, Calibration]:
    """``{method: Calibration}`` of the calibrate stage's ``<calibration_dir>/<method>.json``."""
    return {method: Calibration.load(Path(calibration_dir) / f"{method}.json") for method in methods}


def with_unseen_factor(calibration: Calibration, factor: float) -> Calibration:
    """``calibration`` with the unseen-LP widening ``factor`` (the part below a point mass at the top too)."""
    out = dataclasses.replace(calibration, unseen_lp_sigma_factor=float(factor))
    if out.below_top is not None:
        out.below_top = dataclasses.replace(out.below_top, unseen_lp_sigma_factor=float(factor))
    return out


def served_lp_coverage(calibration: Calibration, table: pd.DataFrame, level: float, bounds=None) -> float:
    """Coverage at ``level`` of the served distribution on ``table``'s rows (``lp, human, mu, sigma``;
    the raw model output), counted as the metrics count it: the randomised PIT at every point mass
    (:func:`uamt.uncertainty.served.served_coverage`)."""
    from uamt.uncertainty.served import served_coverage

    return float(np.mean(served_coverage(
        calibration, table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float),
        table["lp"].astype(str).to_numpy(dtype=object), table["human"].to_numpy(dtype=float), level, bounds=bounds,
    )))


#: The widenings searched (a held-out LP needing more is reported at the largest).
WIDENING_RANGE = (0.1, 16.0)


def smallest_widening(coverage, level: float, low: float = WIDENING_RANGE[0], high: float = WIDENING_RANGE[1], tol: float = 1e-4) -> float:
    """The smallest factor ``w`` in [``low``, ``high``] with ``coverage(w) >= level`` (bisection; the
    coverage of an interval widened around mu grows with ``w``); ``high`` where even that falls short,
    ``low`` where ``low`` already reaches it."""
    if coverage(low) >= level:
        return low
    if coverage(high) < level:
        return high
    while high - low > tol:
        middle = 0.5 * (low + high)
        low, high = (low, middle) if coverage(middle) >= level else (middle, high)
    return high


def equal_weight_widening(coverage_by_lp: dict, level: float) -> float:
    """The smallest widening (at least 1) under which held-out LPs are covered ``level`` of the time on
    average, each LP weighing the same: ``coverage_by_lp`` maps an LP to its coverage as a function of
    the widening (:func:`smallest_widening`)."""
    return smallest_widening(lambda w: float(np.mean([cover(w) for cover in coverage_by_lp.values()])), level, low=1.0)


def fit_unseen_lp_sigma_factor(
    table, fit, *, level: float = 0.9, min_lp_rows: int = 50, bounds=None
) -> tuple[float, dict[str, float]]:
    """Widening for language pairs the calibration never saw, fitted on dev by leaving each LP out.

    For each LP ``L`` of ``table`` (dev predictions: columns ``lp``, ``human``, ``mu``, ``sigma``)
    with at least ``min_lp_rows`` rows, ``fit`` (table -> :class:`Calibration`) is fitted on the
    other LPs, so ``L`` gets the global fallback exactly as an unseen LP would.  The factor widens
    what is served around mu (interval, risk and point masses alike, as :meth:`Calibration.interval`
    applies it) and is the smallest under which the held-out LPs are covered ``level`` of the time
    *on average over LPs*, each LP weighing the same (at least 1): the coverage an unseen pair can
    expect, not the worst of a few noisy LPs.  Coverage is the served one (:func:`served_lp_coverage`:
    randomised at the point masses of the clipped distribution, the scale's ``bounds``), so a
    distribution with point masses is widened until it covers, not until a closed interval touches
    a mass.  ``c_L`` per LP (the widening that LP alone needed; below 1 where it needed less) is
    returned for the record.

    Returns ``(factor, {L: c_L})``; ``(1.0, {})`` with fewer than two such LPs.
    """
    lps = table["lp"].astype(str).to_numpy()
    names = [name for name in sorted(set(lps.tolist())) if (lps == name).sum() >= min_lp_rows]
    if len(names) < 2:
        return 1.0, {}
    coverage, _, _ = held_out_lp_coverage(dict.fromkeys(names, table), fit, level, min_lp_rows, bounds)
    needed = {name: smallest_widening(cover, level) for name, cover in coverage.items()}
    return equal_weight_widening(coverage, level), needed


def held_out_lp_coverage(tables_by_lp: dict, fit, level: float, min_lp_rows: int, bounds=None) -> tuple[dict, dict, dict]:
    """Each LP ``L`` of ``tables_by_lp`` held out of a fit: ``fit`` (table -> :class:`Calibration`) on
    the other LPs' rows of ``tables_by_lp[L]``, ``L``'s rows of it served that calibration's global
    fallback, as an unseen LP's are.  LPs with fewer than ``min_lp_rows`` rows of their own are left
    out.  Returns ``({L: coverage at level as a function of the widening}, {L: fitted calibration},
    {L: rows})``; the coverage is :func:`served_lp_coverage`."""
    coverage, fitted, sizes = {}, {}, {}
    for lp in sorted(tables_by_lp):
        table = tables_by_lp[lp]
        lps = table["lp"].astype(str).to_numpy()
        held = table[lps == lp]
        if len(held) < min_lp_rows:
            continue
        fitted[lp], sizes[lp] = fit(table[lps != lp]), len(held)
        coverage[lp] = lambda w, c=fitted[lp], rows=held: served_lp_coverage(with_unseen_factor(c, w), rows, level, bounds)
    return coverage, fitted, sizes


def fit_model_unseen_lp_sigma_factor(
    dev_table: pd.DataFrame,
    method: str | None,
    calibration: Calibration,
    *,
    settings: EvaluationSettings | None = None,
    bounds=None,
) -> tuple[float, dict[str, float]]:
    """:func:`fit_unseen_lp_sigma_factor` of a model whose served distribution is ``calibration``.

    Each leave-one-LP-out fit is :func:`refit_served` on the other LPs (the distribution ``calibration``
    serves -- its candidate, point mass at the top or isotonic fit -- refitted): the held-out LP is judged by the global fallback of the calibration an unseen
    LP really gets, and the rule's choice among candidates, the costly part of a fit, is not re-run.  The level
    is ``settings.coverage_gamma``, the rows an LP needs ``settings.min_lp_rows``.  A calibration
    without LPs of its own (``per_lp=False``) treats every LP alike: ``(1.0, {})``.
    """
    settings = settings if settings is not None else EvaluationSettings()
    if not calibration.known_lps:
        return 1.0, {}
    if method is not None:
        dev_table = with_model_sigma(dev_table, method)
    return fit_unseen_lp_sigma_factor(
        dev_table,
        lambda subset: refit_served(subset, method, calibration, settings),
        level=settings.coverage_gamma,
        min_lp_rows=settings.min_lp_rows,
        bounds=bounds,
    )


@dataclasses.dataclass(frozen=True)
class HeldOutModelFit:
    """What :func:`fit_held_out_model_unseen_lp_sigma_factor` fits and measures.

    Attributes
    ----------
    factor : float
        The unseen-LP widening (at least 1).
    needed : dict
        ``{lp: c_L}``: the widening that LP alone needed (below 1 where it needed less).
    coverage : dict
        ``{lp: {"unwidened": ..., "widened": ..., "n": rows}}``: the held-out LP's served coverage at
        the level without the widening and with ``factor``.
    calibrations : dict
        ``{lp: Calibration}``: what an unseen LP got in each fit (the served distribution refitted on
        the other LPs' rows of the model trained without ``lp``), widened by ``factor``.
    """

    factor: float
    needed: dict
    coverage: dict
    calibrations: dict


def fit_held_out_model_unseen_lp_sigma_factor(
    tables_by_lp: dict[str, pd.DataFrame],
    method: str | None,
    calibration: Calibration,
    *,
    settings: EvaluationSettings | None = None,
    bounds=None,
) -> HeldOutModelFit:
    """The unseen-LP widening with the *model* held out as well as the calibration.

    ``tables_by_lp[L]``: the calibration rows (``lp, human, mu, sigma``, every LP) predicted by the
    model trained without ``L`` (:mod:`uamt.leave_one_lp_out`).  For each ``L`` with at least
    ``settings.min_lp_rows`` rows, the distribution ``calibration`` serves is refitted on the other
    LPs' rows (:func:`refit_served`) and ``L``'s rows are served its global fallback, as a pair new to
    model and calibration is.  The factor is the smallest (at least 1) under which those LPs are
    covered ``settings.coverage_gamma`` of the time on average, each LP weighing the same
    (:func:`equal_weight_widening`), the coverage counted as the metrics count it
    (:func:`served_lp_coverage`).  Fewer than two such LPs: factor 1 and nothing measured.
    """
    settings = settings if settings is not None else EvaluationSettings()
    level = settings.coverage_gamma
    if method is not None:
        tables_by_lp = {lp: with_model_sigma(table, method) for lp, table in tables_by_lp.items()}
    coverage, fitted, sizes = held_out_lp_coverage(
        tables_by_lp, lambda subset: refit_served(subset, None, calibration, settings), level, settings.min_lp_rows, bounds
    )
    if len(coverage) < 2:
        return HeldOutModelFit(1.0, {}, {}, {})
    factor = equal_weight_widening(coverage, level)
    return HeldOutModelFit(
        factor=factor,
        needed={lp: smallest_widening(cover, level) for lp, cover in coverage.items()},
        coverage={lp: {"unwidened": cover(1.0), "widened": cover(factor), "n": sizes[lp]} for lp, cover in coverage.items()},
        calibrations={lp: with_unseen_factor(c, factor) for lp, c in fitted.items()},
    )
