"""Scoring translations with a calibrated predictor: ``uamt score``, ``uamt compare`` and their I/O.

:mod:`uamt.serving.text_io` reads line-aligned text files and writes outputs atomically;
:mod:`uamt.serving.scores` builds the predictor's input frame, checks the model fits the inputs
and computes segment records and the system score; :mod:`uamt.serving.compare` gives
P(system A better than system B).
"""

from uamt.serving.compare import (
    compare_outputs,
    comparison_table,
    paired_bootstrap_probability,
    probability_better,
)
from uamt.serving.scores import (
    DEFAULT_MODEL_NAME,
    SystemScore,
    build_frame,
    check_signature,
    default_model_uri,
    load_scoring_predictor,
    model_name_from_params,
    predict,
    score_summary,
    segment_records,
    system_score,
)
from uamt.serving.text_io import (
    atomic_write_text,
    check_output_path,
    read_aligned,
    read_lines,
    render_segments,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "SystemScore",
    "atomic_write_text",
    "build_frame",
    "check_output_path",
    "check_signature",
    "compare_outputs",
    "comparison_table",
    "default_model_uri",
    "load_scoring_predictor",
    "model_name_from_params",
    "paired_bootstrap_probability",
    "predict",
    "probability_better",
    "read_aligned",
    "read_lines",
    "render_segments",
    "score_summary",
    "segment_records",
    "system_score",
]
