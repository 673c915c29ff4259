"""The :class:`uamt.serving.predictor.Predictor` protocol declares what its implementation takes."""

from __future__ import annotations

import inspect


def _parameters(function) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_protocol_predict_frame_matches_the_calibrated_predictor():
    from uamt.serving.calibrated_predictor import CalibratedPredictor
    from uamt.serving.predictor import Predictor

    declared = _parameters(Predictor.predict_frame)
    assert ("interval", inspect.Parameter.KEYWORD_ONLY, "gaussian") in declared
    assert declared == _parameters(CalibratedPredictor.predict_frame)
