"""uamt: uncertainty-aware machine-translation evaluation.

>>> import uamt
>>> model = uamt.load_model("models:/uamt-comet@champion")              # doctest: +SKIP
>>> model.score(src=["Der Hund schläft."], mt=["The dog sleeps."],
...             ref=["The dog is sleeping."])                             # doctest: +SKIP

``import uamt`` stays light: the model's libraries load in :func:`load_model`.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load_model"]


def load_model(model=None, **options):
    """Load a calibrated uamt model; see :func:`uamt.serving.api.load_model`.

    Parameters
    ----------
    model : str or path, optional
        ``models:/NAME@ALIAS``, ``models:/NAME/VERSION``, ``runs:/ID/model`` or a local model
        folder (default: ``models:/uamt-comet@champion``).
    **options
        ``reference_free``, ``tracking_uri``, ``params_path``.

    Returns
    -------
    uamt.serving.api.Model
        ``.score(src=[...], mt=[...], ref=[...])`` returns a DataFrame of mu, sigma, lower,
        upper, risk, clipped, lp and warnings per segment.
    """
    from uamt.serving.api import load_model as _load_model

    return _load_model(model, **options)
