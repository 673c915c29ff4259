"""The MLflow model registry: the store and its checks (:mod:`uamt.registry.store`) and the
register stage's logging, gating and promotion (:mod:`uamt.registry.register`).

Imports nothing: MLflow loads when a submodule is imported.
"""
