"""σ's weight in the served distribution, chosen by the calibration: the model's σ tempered
towards its LP's median,

.. math:: \\sigma_\\lambda = m_{LP}^{1-\\lambda}\\,\\sigma^\\lambda,

before the calibration reads it (:meth:`uamt.serving.model_calibration.Calibration._z`).  λ = 1 is
the model's own σ; λ = 0 is one σ per LP (the point estimate's calibration with the model's μ: width
then varies with μ and the LP only); in between, σ's spread is shrunk in log space.  :math:`m_{LP}`
is the median σ of the LP's calibration rows, and a row of an LP they lack takes the median of every
row (:data:`~uamt.uncertainty.calibrators.GLOBAL`).  A per-LP constant is absorbed by the per-LP
calibration; the medians matter only where LPs are pooled (the global fallback).

A row of a pair the calibration never saw may take a weight of its own, ``unseen_weight`` (None: the
same λ): within a known LP the calibration has rows to learn the width from, for a new pair it has
only the global fallback, and there the model's σ may say what μ cannot.  The calibrate stage
chooses it by the held-out-model CRPS (:func:`uamt.model_evaluation.choose_unseen_sigma_weight`).
Measured 2026-12-01 (docs/quality.md): with the fallback fitted in its own units, σ no longer pays
for unseen pairs (HTS held-out CRPS 2.1505 / 2.1418 / 2.1505 at λ = 0 / ½ / 1), so both served
models keep λ = 0 for them; before that fix λ = 1 had won 3.3 %, standing in for the fallback.

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
import pandas as pd

from uamt.uncertainty.calibrators import GLOBAL


@dataclass(frozen=True)
class SigmaTempering:
    """σ → :math:`m_{LP}^{1-\\lambda}\\sigma^\\lambda` (``weight`` = λ in [0, 1]; ``medians``: LP or
    :data:`GLOBAL` → median σ > 0 of the calibration rows)."""

    weight: float
    medians: dict[str, float] = field(default_factory=dict)
    unseen_weight: float | None = None

    @classmethod
    def fit(cls, sigma, lp, weight: float, unseen_weight: float | None = None) -> SigmaTempering:
        """Medians of ``sigma`` (shape [n], standard deviations) per LP of ``lp`` (shape [n]) and
        over every row; a group without a positive σ gets 1 (any constant serves: see the module).
        ``unseen_weight``: λ for rows of an LP without a median (None: ``weight``)."""
        sigma = np.asarray(sigma, dtype=float)
        lps = np.asarray(lp, dtype=object).astype(str)

        def median(values: np.ndarray) -> float:
            positive = values[np.isfinite(values) & (values > 0)]
            return float(np.median(positive)) if positive.size else 1.0

        medians = {str(name): median(sigma[lps == name]) for name in sorted(set(lps.tolist()))}
        medians[GLOBAL] = median(sigma)
        out = cls(float(weight), medians, None if unseen_weight is None else float(unseen_weight))
        problem = out.problem()
        if problem:
            raise ValueError(problem)
        return out

    @property
    def unseen(self) -> float:
        """λ of a row of an LP without a median of its own."""
        return self.weight if self.unseen_weight is None else self.unseen_weight

    @property
    def is_identity(self) -> bool:
        """λ = 1 for every row: σ as the model gave it."""
        return self.weight == 1.0 and self.unseen == 1.0

    def with_unseen_weight(self, weight: float | None) -> SigmaTempering:
        """This tempering with ``unseen_weight`` = ``weight`` (None: the in-domain λ)."""
        out = SigmaTempering(self.weight, dict(self.medians), None if weight is None else float(weight))
        problem = out.problem()
        if problem:
            raise ValueError(problem)
        return out

    def apply(self, sigma, lp) -> np.ndarray:
        """σ_λ, shape [n], for ``sigma`` (shape [n]) of the rows of ``lp`` (None: every row unseen,
        a string, or shape [n]); a row of an LP without a median (or of :data:`GLOBAL`) is unseen:
        the global median, weight :attr:`unseen`."""
        sigma = np.asarray(sigma, dtype=float)
        if self.is_identity:
            return sigma
        if lp is None or isinstance(lp, str):
            names = np.full(sigma.shape, GLOBAL if lp is None else lp, dtype=object)
        else:
            names = np.asarray(lp, dtype=object).reshape(sigma.shape)
        own = pd.Series(names.ravel(), dtype=object).astype(str).map(self.medians).to_numpy(dtype=float)
        seen = (np.isfinite(own) & (names.ravel() != GLOBAL)).reshape(sigma.shape)
        median = np.where(seen, own.reshape(sigma.shape), self.medians[GLOBAL])
        weight = np.where(seen, self.weight, self.unseen)
        return median ** (1.0 - weight) * sigma**weight

    def applied(self, table):
        """A predictions ``table`` (columns ``lp``, ``sigma``) with its ``sigma`` tempered."""
        lp = table["lp"].astype(str).to_numpy(dtype=object)
        return table.assign(sigma=self.apply(table["sigma"].to_numpy(dtype=float), lp))

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "medians": dict(self.medians),
            **({"unseen_weight": self.unseen_weight} if self.unseen_weight is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SigmaTempering:
        try:
            unseen = data.get("unseen_weight")
            return cls(
                float(data["weight"]),
                {str(k): float(v) for k, v in data["medians"].items()},
                None if unseen is None else float(unseen),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"sigma_tempering: malformed ({type(exc).__name__}: {exc})") from exc

    def problem(self) -> str | None:
        """What makes it unusable (λ outside [0, 1], a median not > 0, no global median), or None."""
        if not (math.isfinite(self.weight) and 0.0 <= self.weight <= 1.0):
            return f"sigma_tempering.weight = {self.weight!r} must be in [0, 1]"
        if self.unseen_weight is not None and not (math.isfinite(self.unseen_weight) and 0.0 <= self.unseen_weight <= 1.0):
            return f"sigma_tempering.unseen_weight = {self.unseen_weight!r} must be in [0, 1]"
        if GLOBAL not in self.medians:
            return f"sigma_tempering.medians has no {GLOBAL!r} entry (the median for unseen LPs)"
        for name, value in self.medians.items():
            if not (math.isfinite(value) and value > 0):
                return f"sigma_tempering.medians[{name}] = {value!r} must be a finite number > 0"
        return None
