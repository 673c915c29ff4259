"""Serving: one use case, texts -> a scored batch (:mod:`uamt.serving.scorer`), and the Python API
(:mod:`uamt.serving.api`, reached as :func:`uamt.load_model`).

The package imports nothing heavy: pandas and the model's libraries load when a model is loaded.
"""
