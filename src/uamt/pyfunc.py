"""Where the oldest registered models find their MLflow wrapper: kept for models already in users' registries.

The first registered versions pickled their ``python_model`` as ``uamt.pyfunc.UamtPyfunc`` (MLflow
pickles the class by its module path).  The class lives in :mod:`uamt.serving.mlflow_pyfunc`; it is
imported lazily so that importing this module loads no MLflow.  Do not remove this module while such
versions may still be loaded.
"""


def __getattr__(name: str):
    if name == "UamtPyfunc":
        from uamt.serving.mlflow_pyfunc import UamtPyfunc

        return UamtPyfunc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
