"""Models already in users' registries keep loading after the MLflow wrapper moved.

MLflow pickles a model's ``python_model`` (``UamtPyfunc``) by its module path, so a version registered
while the class lived in ``uamt.pyfunc`` or ``uamt.pyfunc_model`` names that module inside its
``python_model.pkl``.  Each such pickle must still load, through MLflow and through ``uamt score``'s fast
path (:func:`uamt.serving.predictor.uamt_artifacts`), and predict as a current one does.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import cloudpickle
import pandas as pd
import pytest
from test_reliability_scoring import MT, REF, SRC, fake_encoder, uamt_model  # noqa: F401 - fixtures

import mlflow

HOMES = ["uamt.pyfunc", "uamt.pyfunc_model", "uamt.serving.mlflow_pyfunc"]


def pickled_at(module: str, folder: Path) -> Path:
    """Rewrite ``folder``'s ``python_model.pkl`` as a ``UamtPyfunc`` pickled by the path ``module``
    (what MLflow wrote while the class lived there)."""
    from uamt.serving.mlflow_pyfunc import UamtPyfunc

    importlib.import_module(module)
    current = UamtPyfunc.__module__
    UamtPyfunc.__module__ = module  # cloudpickle pickles a class by reference, by its __module__
    try:
        data = cloudpickle.dumps(UamtPyfunc())
    finally:
        UamtPyfunc.__module__ = current
    (folder / "python_model.pkl").write_bytes(data)
    return folder


@pytest.mark.parametrize("module", HOMES)
def test_a_model_pickled_at_an_old_home_loads_and_predicts(module, uamt_model, fake_encoder, tmp_path):  # noqa: F811
    from uamt.serving.mlflow_pyfunc import UamtPyfunc
    from uamt.serving.predictor import load_predictor, uamt_artifacts

    folder = pickled_at(module, Path(shutil.copytree(uamt_model, tmp_path / "model")))
    pickled = (folder / "python_model.pkl").read_bytes()
    assert module.encode() in pickled and (module == HOMES[-1] or HOMES[-1].encode() not in pickled)
    frame = pd.DataFrame({"src": SRC[:3], "mt": MT[:3], "ref": REF[:3]})

    loaded = mlflow.pyfunc.load_model(str(folder))
    assert type(loaded.unwrap_python_model()) is UamtPyfunc
    through_mlflow = loaded.predict(frame)
    assert uamt_artifacts(folder) is not None  # recognised as a uamt model: no MLflow on `uamt score`
    direct = load_predictor(str(folder)).predict_frame(frame)
    pd.testing.assert_frame_equal(through_mlflow[list(direct.columns)], direct)


def test_an_unknown_pickled_class_is_not_taken_for_a_uamt_model(uamt_model, tmp_path):  # noqa: F811
    from uamt.serving.predictor import uamt_artifacts

    folder = Path(shutil.copytree(uamt_model, tmp_path / "model"))
    (folder / "python_model.pkl").write_bytes(cloudpickle.dumps(pd.DataFrame))
    assert uamt_artifacts(folder) is None
