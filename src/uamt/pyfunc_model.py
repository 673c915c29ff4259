"""Where registered models find their MLflow wrapper: kept for models already in users' registries.

MLflow pickles the model's ``python_model`` (:class:`uamt.serving.mlflow_pyfunc.UamtPyfunc`) by its
module path, so every version registered while the class lived here loads ``uamt.pyfunc_model.UamtPyfunc``.
The class itself lives in :mod:`uamt.serving.mlflow_pyfunc`; do not remove this module while such
versions may still be loaded.
"""

from uamt.serving.mlflow_pyfunc import UamtPyfunc

__all__ = ["UamtPyfunc"]
