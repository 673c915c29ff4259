"""Prefect flows of uamt: wiring of the ``uamt.stages`` functions, nothing else.

* :mod:`flows.dvc_stages` - dvc.yaml read once: each stage's deps, outs, params, task and cache policy.
* :mod:`flows.pipeline` - ``uamt-pipeline``: the dvc.yaml stages as Prefect tasks.
* :mod:`flows.retrain` - ``uamt-retrain``: ingest new human annotations, then retrain and register.
* :mod:`flows.experiments` - ``uamt-experiments``: the ``exp_*`` analyses and the ``report`` stage.
"""
