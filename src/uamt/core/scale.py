"""The human score scale a model's predictions are on (MQM, DA z-scores, HTER, ...).

Its own small module: datasets declare their scale and predictors report it, and neither should
import the other's dependencies (the data stages must not depend on the scoring stack).
"""

from __future__ import annotations

from dataclasses import dataclass

from uamt.core.errors import UamtError


@dataclass(frozen=True)
class ScoreScale:
    """Which human scores the predictions are on, e.g. ``name="MQM"``, ``description=...``.

    ``bounds``: the ``(lowest, highest)`` score the scale allows (MQM: ``(-25, 0)``, 0 = no error),
    or None when unbounded/unknown; predictions are clipped to it.
    """

    name: str
    description: str
    default_risk_threshold: float
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.bounds is not None:
            low, high = (float(b) for b in self.bounds)
            if not low < high:
                raise UamtError(f"scale {self.name}: bounds {list(self.bounds)} must be (low, high), low < high")
            object.__setattr__(self, "bounds", (low, high))
