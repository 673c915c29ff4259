"""How models are named, in one place: pipeline model names and registered model names (and
how the synthetic training rows are told apart by their ``system``).

Two different suffixes mark a reference-free (QE) model, one per namespace:

* :data:`QE_MODEL_SUFFIX` (``_qe``) ends a *pipeline model name*, which is also its folder
  (``models/hts_qe``), its predictions file and its calibration file: ``hts_qe`` is the method
  ``hts`` trained on <src, mt> only.
* :data:`QE_REGISTERED_SUFFIX` (``-qe``) ends a *registered model name* in the MLflow registry:
  ``uamt-comet-qe`` is what ``uamt score`` loads when no reference is given.

Nothing here imports torch or MLflow, so the scoring path can read it.
"""

from __future__ import annotations

import numpy as np

#: Suffix of a reference-free pipeline model (and folder) name: ``hts_qe`` is ``hts`` on <src, mt>.
QE_MODEL_SUFFIX = "_qe"
#: Suffix of the reference-free registered model's name: ``uamt-comet-qe`` next to ``uamt-comet``.
QE_REGISTERED_SUFFIX = "-qe"
#: The ``system`` of every synthetic training row (:func:`uamt.challenge.synthetic_failures`)
#: starts with this, then its mode or "reference".
SYNTHETIC_SYSTEM_PREFIX = "synthetic-"


def qe_model_name(method: str) -> str:
    """The pipeline model name of ``method`` trained reference-free (``hts`` -> ``hts_qe``)."""
    return f"{method}{QE_MODEL_SUFFIX}"


def base_method(model: str) -> str:
    """The method of a pipeline model name (``hts_qe`` -> ``hts``; ``hts`` -> ``hts``)."""
    return model.removesuffix(QE_MODEL_SUFFIX)


def is_reference_free(model: str) -> bool:
    """Whether the pipeline model name ``model`` is a reference-free (QE) model."""
    return model.endswith(QE_MODEL_SUFFIX)


def qe_registered_name(name: str) -> str:
    """The registered name of the QE model next to the registered model ``name``
    (``uamt-comet`` -> ``uamt-comet-qe``)."""
    return f"{name}{QE_REGISTERED_SUFFIX}"


def is_synthetic(rows):
    """Boolean array [n_rows]: the rows of the DataFrame ``rows`` that
    :func:`uamt.challenge.synthetic_failures` made (read off ``system``; none without that column)."""
    if "system" not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return rows["system"].astype(str).str.startswith(SYNTHETIC_SYSTEM_PREFIX).to_numpy()
