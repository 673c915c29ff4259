"""Serving: one use case, texts -> a scored batch (:mod:`uamt.serving.scorer`), used by the CLI, REST,
batch scoring and the Python API (:mod:`uamt.serving.api`, reached as :func:`uamt.load_model`).

The model
    :mod:`~uamt.serving.predictor` (the ``Predictor`` protocol, loading ``models:/...``),
    :mod:`~uamt.serving.calibrated_predictor` (the model a registered version carries, its signature),
    :mod:`~uamt.serving.mlflow_pyfunc` (MLflow's ``PythonModel`` around it),
    :mod:`~uamt.serving.model_calibration` (its dev-fitted calibration),
    :mod:`~uamt.serving.multi_reference` (several references per segment).
Around the use case
    :mod:`~uamt.serving.scores` (segment records, system score), :mod:`~uamt.serving.compare`
    (P(A better than B)), :mod:`~uamt.serving.language_pair` (which calibration scores a row),
    :mod:`~uamt.serving.text_io` (line-aligned files), :mod:`~uamt.serving.batch` (Parquet/CSV in
    partitions, on Dask).
REST
    :mod:`~uamt.serving.rest` (the contract), :mod:`~uamt.serving.rest_schema` (its pydantic models),
    :mod:`~uamt.serving.server` (FastAPI + uvicorn).

The package imports nothing heavy: pandas and the model's libraries load when a model is loaded.
"""
