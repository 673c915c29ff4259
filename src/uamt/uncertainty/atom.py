"""A point mass at the top of the scale: the probability that a translation gets the best score.

MQM is zero-inflated: 21-73 % of the news test rows per LP are exactly 0 (no error).  A continuous
served distribution clipped to the scale puts at 0 only the mass it happens to have above 0; the
rest of what should be an atom is spread over (mu, 0), where almost no human score lies (measured
on test, HTS: a served P(MQM = 0) of 0.38 on en-ru against 0.73 observed).  :class:`TopAtom` holds
a probability :math:`\\pi` of the top of the scale per LP and per quantile bin of the served mu;
the served distribution is then the mixture

.. math:: F(q) = (1 - \\pi)\\,F_{<}(q) \\quad (q < top), \\qquad F(top) = 1,

with :math:`F_{<}` the calibration of the same candidate refitted on the rows below the top
(:func:`uamt.serving.model_calibration.with_top_atom`), whose own mass at or above the top is
clipped onto it.  :math:`\\pi` is fitted so that the total served mass at the top,
:math:`\\pi + (1 - \\pi)(1 - F_{<}(top^-))`, averages to the share of calibration rows at the top in
each bin.  The quantile at level p is :math:`\\min(F_{<}^{-1}(p / (1 - \\pi)), top)` for
:math:`p < 1 - \\pi` and the top otherwise.

Continuous in mu (atoms fitted since 2026-11-30, as the Mondrian distributions below them:
:meth:`uamt.uncertainty.candidates.MondrianConformalCalibrator._row_knots`): :math:`\\pi` is
interpolated linearly in mu between the bins' centres (their rows' median served mu), and the rates
at the centres are solved so that each bin's mean served top mass is still its share of rows at the
top (:meth:`TopAtom._fit_group`).  Stepwise, :math:`\\pi` jumped at each bin edge; served since
``uamt-comet`` v9 (HTS test CRPS 1.7500 with v8's stepwise atom, 1.7434 with v9's, cross-fitted dev
1.9827 and 1.9797; docs/results.md).  Atoms without centres (fitted before) stay stepwise.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uamt.uncertainty.calibrators import GLOBAL, lp_groups

log = logging.getLogger(__name__)


@dataclass
class TopAtom:
    """Extra P(Q = ``value``) per LP (bins of the served mu cut at ``edges``) with a global fallback.

    ``lp_params``: lp -> ``{"edges": [n_bins - 1], "rates": [n_bins], "n": rows}``; ``global_params``
    the same over every row (LPs without their own fit, unseen LPs).
    """

    value: float
    n_bins: int = 5
    lp_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    global_params: dict[str, Any] | None = None
    #: pi interpolated in mu between the bins' centres (params ``centres``), else stepwise per bin
    interpolate: bool = True

    @staticmethod
    def _rate(at_top: np.ndarray, clipped: np.ndarray) -> float:
        """The extra top mass pi that makes pi + (1 - pi) * mean(clipped) the observed share."""
        share, already = float(at_top.mean()), float(clipped.mean())
        return float(np.clip((share - already) / (1.0 - already), 0.0, 1.0)) if already < 1.0 else 0.0

    @classmethod
    def _fit_group(
        cls, at_top: np.ndarray, center: np.ndarray, clipped: np.ndarray, n_bins: int, interpolate: bool = True
    ) -> dict[str, Any]:
        edges = np.quantile(center, np.arange(1, n_bins) / n_bins) if center.size else np.array([])
        bins = np.searchsorted(edges, center)
        overall = cls._rate(at_top, clipped) if at_top.size else 0.0
        rates = [cls._rate(at_top[bins == b], clipped[bins == b]) if np.any(bins == b) else overall for b in range(n_bins)]
        params = {"edges": [float(e) for e in edges], "rates": rates, "n": int(at_top.size)}
        if interpolate and n_bins > 1 and all(np.any(bins == b) for b in range(n_bins)):
            centres = np.array([np.median(center[bins == b]) for b in range(n_bins)])
            if np.all(np.diff(centres) > 0):
                params["centres"] = [float(c) for c in centres]
                params["rates"] = cls._interpolated_rates(at_top, center, clipped, bins, centres, np.asarray(rates))
        return params

    #: Passes of :meth:`_interpolated_rates` (each moves every rate by its bin's remaining gap).
    RATE_PASSES = 50

    @classmethod
    def _interpolated_rates(cls, at_top, center, clipped, bins, centres, rates) -> list[float]:
        """Rates at the bins' ``centres`` (shape [n_bins]) such that, with pi interpolated between
        them, each bin's mean served top mass :math:`\\pi_i + (1 - \\pi_i) c_i` is its share of rows
        at the top, as the stepwise rates make it: Jacobi passes from the stepwise ``rates``, each
        adding a bin's remaining gap divided by :math:`1 - \\bar c_b` (clipped to [0, 1], so a bin
        whose share the interpolation cannot reach keeps the nearest rate that does).  A bin whose
        rate is inside (0, 1) but still off its share after the passes is logged: on v10's
        calibration rows every such bin was within 1e-6 (the gaps left were bins at rate 0, whose
        distribution below already clips more than their share onto the top)."""
        rates = rates.astype(float).copy()
        share = np.array([at_top[bins == b].mean() for b in range(rates.size)])
        room = np.array([max(1.0 - clipped[bins == b].mean(), 1e-9) for b in range(rates.size)])

        def gaps(rates: np.ndarray) -> np.ndarray:
            pi = np.interp(center, centres, rates)
            mass = pi + (1.0 - pi) * clipped
            return share - np.array([mass[bins == b].mean() for b in range(rates.size)])

        for _ in range(cls.RATE_PASSES):
            gap = gaps(rates)
            if np.max(np.abs(gap)) < 1e-9:
                break
            rates = np.clip(rates + gap / room, 0.0, 1.0)
        gap = gaps(rates)
        unsolved = (rates > 0.0) & (rates < 1.0) & (np.abs(gap) > 1e-6)
        if unsolved.any():
            log.warning(
                "top atom: %d passes left bins %s off their share at the top by %s; the served mass at the top is off by that much there",
                cls.RATE_PASSES, np.flatnonzero(unsolved).tolist(), np.round(gap[unsolved], 6).tolist(),
            )
        return [float(r) for r in rates]

    @classmethod
    def fit(
        cls, human, center, lp, value: float, *, clipped=None, n_bins: int = 5, min_lp_rows: int = 50, interpolate: bool = True
    ) -> TopAtom:
        """Fit on calibration rows: ``human`` scores, served ``center`` (mu) and ``lp``, each shape [n].

        ``clipped`` (shape [n], default 0): the mass the distribution below the top already puts at or
        above it, which clipping adds to the atom, :math:`1 - F_{<}(top^-)`.  Each bin's rate is the
        extra mass :math:`\\pi = (s - \\bar c) / (1 - \\bar c)` (clipped to [0, 1]) that makes the bin's
        mean served top mass :math:`\\pi + (1 - \\pi)\\,\\bar c` its share s of rows at the top.
        """
        human = np.asarray(human, dtype=float)
        center = np.asarray(center, dtype=float)
        lp = np.asarray(lp, dtype=object).astype(str)
        clipped = np.zeros(human.size) if clipped is None else np.asarray(clipped, dtype=float)
        if not (human.shape == center.shape == lp.shape == clipped.shape) or human.ndim != 1:
            raise ValueError(
                f"human {human.shape}, center {center.shape}, lp {lp.shape} and clipped {clipped.shape} must be 1-d and equal"
            )
        if int(n_bins) < 1:
            raise ValueError(f"n_bins={n_bins!r} must be >= 1")
        at_top = (human >= value).astype(float)
        atom = cls(value=float(value), n_bins=int(n_bins), interpolate=bool(interpolate))
        atom.global_params = cls._fit_group(at_top, center, clipped, atom.n_bins, atom.interpolate)
        for name in sorted(set(lp.tolist())):
            rows = lp == name
            if rows.sum() >= min_lp_rows:
                atom.lp_params[name] = cls._fit_group(at_top[rows], center[rows], clipped[rows], atom.n_bins, atom.interpolate)
        return atom

    def probability(self, center, lp=None) -> np.ndarray:
        """P(Q = value) of each row, shape [n], from its LP's (or the global) bins of ``center``:
        interpolated between their centres where the fit recorded them, else its bin's rate."""
        center = np.asarray(center, dtype=float)
        if lp is None or isinstance(lp, str):
            lps = np.full(center.size, GLOBAL if lp is None else lp, dtype=object)
        else:
            lps = np.asarray(lp, dtype=object)
        out = np.empty(center.size)
        for name, rows in lp_groups(lps):
            params = self.lp_params.get(str(name)) or self.global_params
            rates = np.asarray(params["rates"], dtype=float)
            if self.interpolate and params.get("centres"):
                out[rows] = np.interp(center[rows], np.asarray(params["centres"], dtype=float), rates)
                continue
            out[rows] = rates[np.searchsorted(np.asarray(params["edges"], dtype=float), center[rows])]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "n_bins": self.n_bins,
            "interpolate": self.interpolate,
            "global": self.global_params,
            "per_lp": self.lp_params,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopAtom:
        return cls(
            value=float(data["value"]),
            n_bins=int(data["n_bins"]),
            lp_params={str(k): dict(v) for k, v in (data.get("per_lp") or {}).items()},
            global_params=dict(data["global"]),
            # atoms written before 2026-11-30 have no centres: stepwise whatever this says
            interpolate=bool(data.get("interpolate", False)),
        )

    def problem(self) -> str | None:
        """What makes the parameters unusable, or None."""
        groups: Sequence[tuple[str, Any]] = [("global", self.global_params), *self.lp_params.items()]
        for name, params in groups:
            if not isinstance(params, dict):
                return f"top_atom[{name}] is not fitted"
            edges, rates = params.get("edges"), params.get("rates")
            if not isinstance(rates, list) or len(rates) != self.n_bins or not isinstance(edges, list) or len(edges) != self.n_bins - 1:
                return f"top_atom[{name}] needs {self.n_bins - 1} edges and {self.n_bins} rates"
            if any(not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0 for r in rates):
                return f"top_atom[{name}].rates = {rates!r} must be probabilities in [0, 1]"
            if any(not isinstance(e, (int, float)) or not np.isfinite(e) for e in edges) or list(edges) != sorted(edges):
                return f"top_atom[{name}].edges = {edges!r} must be finite and non-decreasing"
            centres = params.get("centres")
            if centres is not None and (
                not isinstance(centres, list)
                or len(centres) != self.n_bins
                or any(not isinstance(c, (int, float)) or not np.isfinite(c) for c in centres)
                or np.any(np.diff(np.asarray(centres, dtype=float)) <= 0)
            ):
                return f"top_atom[{name}].centres = {centres!r} must be {self.n_bins} finite, increasing values"
        return None
