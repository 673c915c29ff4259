"""σ's weight in the served distribution, chosen by the calibration: the model's σ tempered
towards its LP's median,

.. math:: \\sigma_\\lambda = m_{LP}^{1-\\lambda}\\,\\sigma^\\lambda,

before the calibration reads it (:meth:`uamt.serving.model_calibration.Calibration._z`).  λ = 1 is
the model's own σ; λ = 0 is one σ per LP (the point estimate's calibration with the model's μ: width
then varies with μ and the LP only); in between, σ's spread is shrunk in log space.  :math:`m_{LP}`
is the median σ of the LP's calibration rows, and a row of an LP they lack takes the median of every
row (:data:`~uamt.uncertainty.calibrators.GLOBAL`).  A per-LP constant is absorbed by the per-LP
calibration; the medians matter only where LPs are pooled (the global fallback).

Why: measured on v9 (``benchmarks/sigma_tempering.py``, docs/quality.md), every σ-method's served
CRPS is better with no σ than with its own, cross-fitted on the calibration rows and on test; only the
ensemble's and the QE model's σ paid on the unseen biomedical LPs.  The calibrate stage now picks λ
from ``evaluate.sigma_weights`` by the cross-fitted CRPS of the served distribution
(:func:`uamt.model_evaluation.choose_sigma_weight`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uamt.uncertainty.calibrators import GLOBAL


@dataclass(frozen=True)
class SigmaTempering:
    """σ → :math:`m_{LP}^{1-\\lambda}\\sigma^\\lambda` (``weight`` = λ in [0, 1]; ``medians``: LP or
    :data:`GLOBAL` → median σ > 0 of the calibration rows)."""

    weight: float
    medians: dict[str, float] = field(default_factory=dict)

    @classmethod
    def fit(cls, sigma, lp, weight: float) -> SigmaTempering:
        """Medians of ``sigma`` (shape [n], standard deviations) per LP of ``lp`` (shape [n]) and
        over every row; a group without a positive σ gets 1 (any constant serves: see the module)."""
        sigma = np.asarray(sigma, dtype=float)
        lps = np.asarray(lp, dtype=object).astype(str)

        def median(values: np.ndarray) -> float:
            positive = values[np.isfinite(values) & (values > 0)]
            return float(np.median(positive)) if positive.size else 1.0

        medians = {str(name): median(sigma[lps == name]) for name in sorted(set(lps.tolist()))}
        medians[GLOBAL] = median(sigma)
        out = cls(float(weight), medians)
        problem = out.problem()
        if problem:
            raise ValueError(problem)
        return out

    @property
    def is_identity(self) -> bool:
        """λ = 1: σ as the model gave it."""
        return self.weight == 1.0

    def apply(self, sigma, lp) -> np.ndarray:
        """σ_λ, shape [n], for ``sigma`` (shape [n]) of the rows of ``lp`` (None: every row unseen,
        a string, or shape [n])."""
        sigma = np.asarray(sigma, dtype=float)
        if self.is_identity:
            return sigma
        if lp is None or isinstance(lp, str):
            median = np.full(sigma.shape, self.medians.get(GLOBAL if lp is None else lp, self.medians[GLOBAL]))
        else:
            names = np.asarray(lp, dtype=object)
            median = np.array([self.medians.get(str(name), self.medians[GLOBAL]) for name in names.tolist()], dtype=float)
            median = median.reshape(sigma.shape)
        return median ** (1.0 - self.weight) * sigma**self.weight

    def applied(self, table):
        """A predictions ``table`` (columns ``lp``, ``sigma``) with its ``sigma`` tempered."""
        lp = table["lp"].astype(str).to_numpy(dtype=object)
        return table.assign(sigma=self.apply(table["sigma"].to_numpy(dtype=float), lp))

    def to_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "medians": dict(self.medians)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SigmaTempering:
        try:
            return cls(float(data["weight"]), {str(k): float(v) for k, v in data["medians"].items()})
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"sigma_tempering: malformed ({type(exc).__name__}: {exc})") from exc

    def problem(self) -> str | None:
        """What makes it unusable (λ outside [0, 1], a median not > 0, no global median), or None."""
        if not (math.isfinite(self.weight) and 0.0 <= self.weight <= 1.0):
            return f"sigma_tempering.weight = {self.weight!r} must be in [0, 1]"
        if GLOBAL not in self.medians:
            return f"sigma_tempering.medians has no {GLOBAL!r} entry (the median for unseen LPs)"
        for name, value in self.medians.items():
            if not (math.isfinite(value) and value > 0):
                return f"sigma_tempering.medians[{name}] = {value!r} must be a finite number > 0"
        return None
