"""Prefect flows of uamt: wiring of the ``uamt.stages`` functions, nothing else.

* :mod:`flows.pipeline` - ``uamt-pipeline``: the dvc.yaml stages as Prefect tasks.
* :mod:`flows.retrain` - ``uamt-retrain``: ingest new human annotations, then retrain and register.
* :mod:`flows.experiments` - ``uamt-experiments``: the ``exp_*`` analyses and the ``report`` stage.
"""
